//! What plans cost on the host. Once per GPU-engine communicator: lowering the `ranks + 1`
//! schedules its calls and graph launches may run (StragglAR with each straggler, and Ring) and
//! encoding one rank's blobs, which serve every message size (no per-size work on the GPU
//! engine's path). Per new message size on the host engine: laying out the plan of that count
//! from its cached lowering. Run with `cargo bench --bench plan_build`.

use std::time::Instant;

use stragglar::plan::{PlanCache, Shape};
use stragglar::reduce::DataType;

/// Distinct counts per host-engine measurement: each one is a new size to the cache.
const SIZES: usize = 200;
/// Rounds of each measurement; the best is reported.
const REPEATS: usize = 5;

fn shape(ranks: usize, choice: usize) -> Shape {
    Shape::of_choice(ranks, choice, DataType::F32)
}

/// Milliseconds to lower the `ranks + 1` schedules, to encode one rank's blobs of them, and
/// the blobs' bytes.
fn communicator_setup(ranks: usize) -> (f64, f64, usize) {
    let mut cache = PlanCache::default();
    let started = Instant::now();
    for choice in 0..=ranks {
        cache.lowered(shape(ranks, choice)).unwrap();
    }
    let lowering = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let mut bytes = 0;
    for choice in 0..=ranks {
        bytes += cache
            .lowered(shape(ranks, choice))
            .unwrap()
            .blob(1)
            .bytes
            .len();
    }
    (lowering, started.elapsed().as_secs_f64() * 1e3, bytes)
}

/// Microseconds per new size of the host engine's StragglAR plan, the schedule cached: the
/// best of `REPEATS` rounds (the allocator makes single rounds noisy).
fn host_plan_per_size_us(ranks: usize) -> f64 {
    (0..REPEATS)
        .map(|_| {
            let mut cache = PlanCache::default();
            cache.get(shape(ranks, 0), 1 << 10).unwrap();
            let started = Instant::now();
            for size in 0..SIZES {
                let count = (1 << 16) + 97 * size;
                std::hint::black_box(cache.get(shape(ranks, 0), count).unwrap());
            }
            started.elapsed().as_secs_f64() * 1e6 / SIZES as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    println!("# once per GPU communicator: lower ranks+1 schedules, encode one rank's blobs");
    println!("# per new size, host engine only: one StragglAR plan ({SIZES} sizes)");
    println!("# ranks  lower-ms  encode-ms  blob-KiB  host-plan-us");
    for ranks in [4, 8, 16, 32] {
        let (lowering, encoding, bytes) = communicator_setup(ranks);
        println!(
            "  {ranks:5}  {lowering:8.2}  {encoding:9.2}  {:8.1}  {:12.1}",
            bytes as f64 / 1024.0,
            host_plan_per_size_us(ranks),
        );
    }
}
