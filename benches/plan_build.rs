//! What a new message size costs the GPU engine on the host, once per (count, type): the
//! StragglAR plan of the call (its schedule is cached per straggler, only the lowering to this
//! count runs), the `ranks + 1` plans a graph launch of that size chooses among (StragglAR with
//! each straggler, and Ring), and encoding one rank's blobs. Run with
//! `cargo bench --bench plan_build`.

use std::time::Instant;

use stragglar::engine::host::runner::{PlanCache, Shape};
use stragglar::plan::encode;
use stragglar::reduce::DataType;

/// Distinct counts per measurement: each one is a new size to the cache.
const SIZES: usize = 200;

fn shape(ranks: usize, choice: usize) -> Shape {
    Shape::of_choice(ranks, choice, DataType::F32)
}

/// Microseconds per new size of building `choices` plans (and, with `encode_rank`, encoding
/// them for that rank), schedules already cached.
fn per_size_us(ranks: usize, choices: usize, encode_rank: Option<usize>) -> f64 {
    let mut cache = PlanCache::default();
    for choice in 0..choices {
        cache.get(shape(ranks, choice), 1 << 10).unwrap();
    }
    let started = Instant::now();
    let mut blob_bytes = 0;
    for size in 0..SIZES {
        let count = (1 << 16) + 97 * size;
        for choice in 0..choices {
            let plan = cache.get(shape(ranks, choice), count).unwrap();
            if let Some(rank) = encode_rank {
                blob_bytes += encode(plan, rank).bytes.len();
            }
        }
    }
    std::hint::black_box(blob_bytes);
    started.elapsed().as_secs_f64() * 1e6 / SIZES as f64
}

fn main() {
    println!("# a new message size on the host, schedules cached (us per size, {SIZES} sizes)");
    println!("# ranks  stragglar-plan  graph-choices  graph-choices+encode");
    for ranks in [4, 8, 16] {
        println!(
            "  {ranks:5}  {:14.1}  {:13.1}  {:20.1}",
            per_size_us(ranks, 1, None),
            per_size_us(ranks, ranks + 1, None),
            per_size_us(ranks, ranks + 1, Some(1)),
        );
    }
}
