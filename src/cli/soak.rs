//! `stragglar soak`: a seeded stream of AllReduce calls on the host engine (ranks as threads
//! over shared memory), each with a random world size, size, type, op, placement, algorithm,
//! designated straggler and actually-late rank; every rank's output checked element by element
//! against the exact expectation and bit for bit against every other rank's.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::args::{parse_bytes, Args, UsageError};
use super::bench::data;
use super::rng::Rng;
use crate::engine::host::link::LinkModel;
use crate::engine::host::runner::{all_reduce, layout_for};
use crate::engine::host::segment::SegmentLayout;
use crate::engine::host::{Buffers, HostComm, HostCommConfig};
use crate::plan::{PlanCache, Shape};
use crate::reduce::{DataType, ReduceOp, Scale};
use crate::schedule::Algorithm;

/// Calls per communicator before a new one (with a new world size) is made.
const CALLS_PER_COMM: usize = 40;
/// Staging per rank and parity: larger messages run in segments, which the soak covers too.
const SOAK_STAGING: usize = 16 << 20;
/// How often a long soak reports progress on stderr.
const PROGRESS_EVERY: Duration = Duration::from_secs(60);

/// One call's parameters, drawn identically on every rank.
#[derive(Debug, Clone, Copy)]
struct CallSpec {
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    shape: Shape,
    late_rank: usize,
    late_us: u64,
}

fn draw(rng: &mut Rng, ranks: usize, max_bytes: u64) -> CallSpec {
    let dtype = DataType::ALL[rng.below(DataType::ALL.len() as u64) as usize];
    let op = ReduceOp::ALL[rng.below(ReduceOp::ALL.len() as u64) as usize];
    // Log-uniform from 1 byte to max_bytes, with some empty calls.
    let bits = 64 - max_bytes.max(2).leading_zeros() as u64;
    let bytes = if rng.below(20) == 0 {
        0
    } else {
        let high = 1u64 << rng.below(bits);
        high + rng.below(high)
    };
    let count = (bytes.min(max_bytes) as usize) / dtype.size();
    let stragglar = rng.below(4) != 0;
    let shape = Shape {
        algorithm: if stragglar {
            Algorithm::Stragglar
        } else {
            Algorithm::Ring
        },
        ranks,
        straggler: rng.below(ranks as u64) as usize,
        dtype,
        pieces: 1,
    };
    CallSpec {
        count,
        dtype,
        op,
        in_place: rng.below(2) == 0,
        shape,
        late_rank: rng.below(ranks as u64) as usize,
        late_us: if rng.below(3) == 0 {
            rng.below(2000)
        } else {
            0
        },
    }
}

/// What one rank reports of one call.
struct Checked {
    call: u64,
    rank: usize,
    wrong: u64,
    elements: u64,
    digest: u64,
}

/// Runs one communicator's calls on `ranks` threads; sends one report per rank and call.
fn run_comm(
    seed: u64,
    comm_index: u64,
    ranks: usize,
    max_bytes: u64,
    first_call: u64,
    calls: usize,
    tx: &mpsc::Sender<Result<Checked, String>>,
) {
    let layout = SegmentLayout {
        flags_per_bank: 1,
        arena_bytes: 64,
    };
    let layout = DataType::ALL.iter().fold(layout, |l, &dtype| {
        let max_count = max_bytes as usize / dtype.size();
        let shapes = [Algorithm::Stragglar, Algorithm::Ring].map(|algorithm| Shape {
            algorithm,
            ranks,
            straggler: 0,
            dtype,
            pieces: 1,
        });
        let fit = layout_for(&mut PlanCache::default(), &shapes, max_count, SOAK_STAGING)
            .expect("plannable");
        SegmentLayout {
            flags_per_bank: l.flags_per_bank.max(fit.flags_per_bank),
            arena_bytes: l.arena_bytes.max(fit.arena_bytes),
        }
    });
    let comm_id = (seed.rotate_left(17) ^ comm_index.wrapping_mul(0x9e37_79b9))
        ^ ((std::process::id() as u64) << 40);
    std::thread::scope(|scope| {
        for rank in 0..ranks {
            let tx = tx.clone();
            scope.spawn(move || {
                let config = HostCommConfig {
                    comm_id,
                    rank,
                    ranks,
                    layout,
                    timeout: Some(Duration::from_secs(120)),
                    setup_timeout: Duration::from_secs(60),
                    link: LinkModel::default(),
                };
                let mut comm = match HostComm::join(config) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = tx.send(Err(format!("join: {e}")));
                        return;
                    }
                };
                let mut cache = PlanCache::default();
                let mut rng = Rng::new(seed ^ comm_index.wrapping_mul(0xd1b5_4a32_d192_ed03));
                // Reused across calls: fresh multi-megabyte buffers would page-fault each time.
                let (mut input, mut output) = (Vec::new(), Vec::new());
                for i in 0..calls as u64 {
                    let call = first_call + i;
                    let spec = draw(&mut rng, ranks, max_bytes);
                    data::input_into(
                        &mut input,
                        spec.dtype,
                        spec.op,
                        rank,
                        spec.count,
                        call as usize,
                    );
                    output.clear();
                    if spec.in_place {
                        output.extend_from_slice(&input);
                    } else {
                        // Poison: an element the engine fails to write shows as wrong.
                        output.resize(input.len(), 0xa5);
                    }
                    let scalar = (spec.op == ReduceOp::PreMulSum).then(|| {
                        let e = data::encode(spec.dtype, data::premul_scalar(rank) as f64);
                        let mut b = [0u8; 8];
                        b[..e.len()].copy_from_slice(&e);
                        b
                    });
                    let scale =
                        Scale::for_op(spec.op, spec.dtype, ranks, scalar).expect("a host scalar");
                    if rank == spec.late_rank && spec.late_us > 0 {
                        std::thread::sleep(Duration::from_micros(spec.late_us));
                    }
                    let buffers = if spec.in_place {
                        Buffers::InPlace(&mut output)
                    } else {
                        Buffers::OutOfPlace {
                            input: &input,
                            output: &mut output,
                        }
                    };
                    if let Err(e) = all_reduce(
                        &mut comm, &mut cache, spec.shape, spec.op, scale, layout, buffers,
                    ) {
                        let _ = tx.send(Err(format!("call {call} ({spec:?}) on rank {rank}: {e}")));
                        return;
                    }
                    let wrong =
                        data::count_wrong(spec.dtype, spec.op, ranks, &output, call as usize);
                    let _ = tx.send(Ok(Checked {
                        call,
                        rank,
                        wrong,
                        elements: spec.count as u64,
                        digest: data::digest(&output),
                    }));
                }
            });
        }
    });
}

/// Runs `stragglar soak`; exit status 1 on any wrong element, disagreement or failure.
pub fn run(mut args: Args) -> Result<i32, UsageError> {
    let calls: u64 = args
        .parsed(&["--calls"], "a number of calls")?
        .unwrap_or(100_000);
    let seed: u64 = args.parsed(&["--seed"], "an integer")?.unwrap_or(1);
    let max_bytes = args
        .value(&["--max-bytes"])?
        .map_or(Ok(64 << 20), |v| parse_bytes(&v))?;
    let max_ranks: usize = args.parsed(&["--max-ranks"], "a rank count")?.unwrap_or(16);
    let budget: Option<u64> = args.parsed(&["--seconds"], "seconds")?;
    let from_call: u64 = args.parsed(&["--from-call"], "a call number")?.unwrap_or(0);
    args.finish()?;
    if from_call % CALLS_PER_COMM as u64 != 0 || from_call > calls {
        return Err(UsageError(format!(
            "--from-call must be a multiple of {CALLS_PER_COMM} (where a communicator starts) and at most --calls"
        )));
    }
    if !(2..=64).contains(&max_ranks) || max_bytes == 0 {
        return Err(UsageError(
            "--max-ranks must be 2..64 and --max-bytes positive".into(),
        ));
    }
    let start = Instant::now();
    let (mut done, mut wrong, mut elements, mut disagreements, mut failures) =
        (0u64, 0u64, 0u64, 0u64, Vec::new());
    let mut rng = Rng::new(seed);
    let mut comm_index = 0;
    // Resuming: the communicators before `from_call` are drawn (so every later one is the same
    // as in a run from the start) but not run.
    while done < from_call {
        let _ = rng.below(max_ranks as u64 - 1);
        done += CALLS_PER_COMM as u64;
        comm_index += 1;
    }
    let mut last_progress = Instant::now();
    while done < calls && budget.is_none_or(|b| start.elapsed().as_secs() < b) {
        let ranks = 2 + rng.below(max_ranks as u64 - 1) as usize;
        let batch = (calls - done).min(CALLS_PER_COMM as u64) as usize;
        let (tx, rx) = mpsc::channel();
        run_comm(seed, comm_index, ranks, max_bytes, done, batch, &tx);
        drop(tx);
        let mut digests = std::collections::HashMap::new();
        for report in rx {
            match report {
                Ok(c) => {
                    wrong += c.wrong;
                    if c.rank == 0 {
                        elements += c.elements * ranks as u64;
                    }
                    let first = *digests.entry(c.call).or_insert(c.digest);
                    disagreements += (first != c.digest) as u64;
                }
                Err(e) => failures.push(e),
            }
        }
        done += batch as u64;
        comm_index += 1;
        if last_progress.elapsed() >= PROGRESS_EVERY {
            last_progress = Instant::now();
            eprintln!(
                "stragglar soak: {done}/{calls} calls, {wrong} wrong elements, {disagreements} disagreements, {:.0} s",
                start.elapsed().as_secs_f64()
            );
        }
        if !failures.is_empty() {
            break;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    println!("stragglar soak: seed {seed}, communicators {} to {comm_index} of 2..{max_ranks} ranks, sizes up to {max_bytes} B", from_call / CALLS_PER_COMM as u64);
    println!("calls {from_call}..{done} ({} run)  elements checked {elements}  wrong elements {wrong}  rank disagreements {disagreements}  failures {}  in {seconds:.1} s", done - from_call, failures.len());
    for f in &failures {
        eprintln!("stragglar soak: {f}");
    }
    Ok(if wrong > 0 || disagreements > 0 || !failures.is_empty() {
        1
    } else {
        0
    })
}
