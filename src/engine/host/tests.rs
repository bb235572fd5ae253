//! The host engine with ranks as threads of this process: results against the interpreter,
//! consecutive calls, aborts and timeouts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::segment::SegmentLayout;
use super::*;
use crate::plan::{lower, simulate, Plan};
use crate::reduce::{DataType, ReduceOp, Scale};
use crate::schedule::{Algorithm, PlanRequest};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn comm_id() -> u64 {
    (std::process::id() as u64) << 32 | NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

fn config(comm_id: u64, rank: usize, ranks: usize, layout: SegmentLayout) -> HostCommConfig {
    HostCommConfig {
        comm_id,
        rank,
        ranks,
        layout,
        timeout: None,
        setup_timeout: Duration::from_secs(20),
        link: Default::default(),
    }
}

fn layout_for(plans: &[&Plan]) -> SegmentLayout {
    SegmentLayout {
        flags_per_bank: plans.iter().map(|p| p.max_values()).max().unwrap(),
        arena_bytes: plans.iter().map(|p| p.max_arena_bytes()).max().unwrap(),
    }
}

fn input(rank: usize, bytes: usize, call: usize) -> Vec<u8> {
    (0..bytes)
        .map(|i| ((i * 7 + rank * 13 + call * 3) % 23) as u8)
        .collect()
}

/// Runs `calls` AllReduces of `plan` on `ranks` threads; checks every output against the
/// interpreter bit for bit.
fn run_threads(plan: Plan, op: ReduceOp, calls: usize, in_place: bool) -> u64 {
    let ranks = plan.ranks;
    let layout = layout_for(&[&plan]);
    let id = comm_id();
    let bytes = plan.count * plan.dtype.size();
    let plan = Arc::new(plan);
    let threads: Vec<_> = (0..ranks)
        .map(|rank| {
            let plan = plan.clone();
            std::thread::spawn(move || {
                let mut comm = HostComm::join(config(id, rank, ranks, layout)).unwrap();
                for call in 0..calls {
                    let ins: Vec<Vec<u8>> = (0..ranks).map(|r| input(r, bytes, call)).collect();
                    let scales = vec![Scale::None; ranks];
                    let want = simulate(&plan, op, &ins, &scales).swap_remove(rank);
                    let mut out = vec![0u8; bytes];
                    if in_place {
                        out.copy_from_slice(&ins[rank]);
                        comm.all_reduce(&plan, op, Scale::None, Buffers::InPlace(&mut out))
                            .unwrap();
                    } else {
                        let buffers = Buffers::OutOfPlace {
                            input: &ins[rank],
                            output: &mut out,
                        };
                        comm.all_reduce(&plan, op, Scale::None, buffers).unwrap();
                    }
                    assert_eq!(out, want, "rank {rank} call {call}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    id
}

fn plan(
    algorithm: Algorithm,
    ranks: usize,
    straggler: usize,
    count: usize,
    dtype: DataType,
) -> Plan {
    let schedule = algorithm
        .schedule(&PlanRequest::new(ranks, straggler))
        .unwrap();
    lower(&schedule, count, dtype).unwrap()
}

#[test]
fn threads_match_the_interpreter_over_consecutive_calls() {
    for (ranks, straggler) in [(2, 1), (3, 0), (4, 3), (5, 2), (8, 7)] {
        run_threads(
            plan(Algorithm::Stragglar, ranks, straggler, 1001, DataType::U8),
            ReduceOp::Sum,
            5,
            false,
        );
    }
    run_threads(
        plan(Algorithm::Ring, 6, 0, 333, DataType::I32),
        ReduceOp::Sum,
        4,
        true,
    );
    run_threads(
        plan(Algorithm::HalvingDoubling, 4, 0, 100, DataType::F32),
        ReduceOp::Max,
        3,
        false,
    );
    for (ranks, straggler) in [(2, 0), (5, 2), (8, 7)] {
        run_threads(
            plan(Algorithm::Multicast, ranks, straggler, 1001, DataType::F32),
            ReduceOp::Sum,
            4,
            ranks == 5,
        );
    }
}

/// Pipelined StragglAR (chunks cut into pieces) on the engine, against the interpreter.
#[test]
fn pipelined_plans_match_the_interpreter() {
    for (ranks, straggler, pieces, count, dtype) in [
        (4, 3, 3, 1001, DataType::U8),
        (5, 1, 2, 777, DataType::F16),
        (8, 7, 6, 4099, DataType::F32),
    ] {
        let schedule = Algorithm::Stragglar
            .schedule(&PlanRequest {
                ranks,
                straggler,
                pieces_per_chunk: pieces,
            })
            .unwrap();
        let plan = lower(&schedule, count, dtype).unwrap();
        run_threads(plan.clone(), ReduceOp::Sum, 3, false);
        run_threads(plan, ReduceOp::Max, 2, true);
    }
}

#[test]
fn every_data_type_in_place() {
    for dtype in DataType::ALL {
        run_threads(
            plan(Algorithm::Stragglar, 4, 1, 257, dtype),
            ReduceOp::Sum,
            3,
            true,
        );
    }
}

#[test]
fn zero_elements_is_not_a_call() {
    run_threads(
        plan(Algorithm::Stragglar, 3, 2, 0, DataType::F32),
        ReduceOp::Sum,
        2,
        false,
    );
}

#[test]
fn abort_ends_a_wait_promptly_on_every_rank() {
    let ranks = 4;
    let p = Arc::new(plan(Algorithm::Stragglar, ranks, 3, 64, DataType::F32));
    let layout = layout_for(&[&p]);
    let id = comm_id();
    let joined = Arc::new(Barrier::new(ranks));
    let threads: Vec<_> = (0..ranks - 1)
        .map(|rank| {
            let (p, joined) = (p.clone(), joined.clone());
            std::thread::spawn(move || {
                let mut comm = HostComm::join(config(id, rank, ranks, layout)).unwrap();
                joined.wait();
                let input = vec![0u8; 256];
                let mut out = vec![0u8; 256];
                let start = Instant::now();
                let e = comm
                    .all_reduce(
                        &p,
                        ReduceOp::Sum,
                        Scale::None,
                        Buffers::OutOfPlace {
                            input: &input,
                            output: &mut out,
                        },
                    )
                    .unwrap_err();
                (e, start.elapsed())
            })
        })
        .collect();
    // The straggler joins, never calls, and aborts.
    let straggler = HostComm::join(config(id, ranks - 1, ranks, layout)).unwrap();
    joined.wait();
    std::thread::sleep(Duration::from_millis(50));
    straggler.abort();
    for t in threads {
        let (e, took) = t.join().unwrap();
        assert!(matches!(e, EngineError::Wait(_)), "{e:?}");
        assert_eq!(e.nccl_code(), crate::nccl::types::ResultCode::REMOTE_ERROR);
        assert!(took < Duration::from_secs(10), "{took:?}");
    }
}

#[test]
fn a_deadline_ends_a_wait_and_later_calls_fail_fast() {
    let p = plan(Algorithm::Stragglar, 2, 1, 16, DataType::F32);
    let layout = layout_for(&[&p]);
    let id = comm_id();
    let other = std::thread::spawn(move || HostComm::join(config(id, 1, 2, layout)).unwrap());
    let mut cfg = config(id, 0, 2, layout);
    cfg.timeout = Some(Duration::from_millis(100));
    let mut comm = HostComm::join(cfg).unwrap();
    let _peer = other.join().unwrap();
    let input = vec![0u8; 64];
    let mut out = vec![0u8; 64];
    let e = comm
        .all_reduce(
            &p,
            ReduceOp::Sum,
            Scale::None,
            Buffers::OutOfPlace {
                input: &input,
                output: &mut out,
            },
        )
        .unwrap_err();
    assert_eq!(e, EngineError::Wait(super::wait::WaitError::Timeout));
    let again = comm
        .all_reduce(
            &p,
            ReduceOp::Sum,
            Scale::None,
            Buffers::OutOfPlace {
                input: &input,
                output: &mut out,
            },
        )
        .unwrap_err();
    assert_eq!(again, e);
}

#[test]
fn plans_larger_than_the_segments_are_refused() {
    let small = plan(Algorithm::Stragglar, 2, 1, 16, DataType::F32);
    let big = plan(Algorithm::Stragglar, 2, 1, 1 << 12, DataType::F32);
    let layout = layout_for(&[&small]);
    let id = comm_id();
    let other = std::thread::spawn(move || HostComm::join(config(id, 1, 2, layout)).unwrap());
    let mut comm = HostComm::join(config(id, 0, 2, layout)).unwrap();
    let _peer = other.join().unwrap();
    let mut buf = vec![0u8; 1 << 14];
    let e = comm
        .all_reduce(&big, ReduceOp::Sum, Scale::None, Buffers::InPlace(&mut buf))
        .unwrap_err();
    assert!(matches!(e, EngineError::TooLarge { .. }), "{e:?}");
}

#[test]
fn no_segment_is_left_in_dev_shm() {
    let id = run_threads(
        plan(Algorithm::Stragglar, 3, 1, 10, DataType::F32),
        ReduceOp::Sum,
        1,
        false,
    );
    let left = leftovers(id);
    assert!(left.is_empty(), "left behind: {left:?}");
}

fn leftovers(id: u64) -> Vec<String> {
    let mine = format!("stragglar.{id:016x}.");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .filter(|n| n.starts_with(&mine))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn messages_larger_than_the_staging_run_in_segments() {
    use super::runner::{all_reduce, layout_for};
    use crate::plan::{PlanCache, Shape};
    let ranks = 3;
    let shape = Shape {
        algorithm: Algorithm::Stragglar,
        ranks,
        straggler: 2,
        dtype: DataType::I32,
        pieces: 1,
    };
    let count = 10_001;
    let mut cache = PlanCache::default();
    let layout = layout_for(&mut cache, &[shape], count, 8 * 1024).unwrap();
    assert!(layout.arena_bytes <= 8 * 1024);
    let id = comm_id();
    let threads: Vec<_> = (0..ranks)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut cache = PlanCache::default();
                let mut comm = HostComm::join(config(id, rank, ranks, layout)).unwrap();
                let value = |r: usize, i: usize| ((i * 31 + r * 7) % 1000) as i32;
                let input: Vec<u8> = (0..count)
                    .flat_map(|i| value(rank, i).to_le_bytes())
                    .collect();
                let mut out = vec![0u8; input.len()];
                let buffers = Buffers::OutOfPlace {
                    input: &input,
                    output: &mut out,
                };
                all_reduce(
                    &mut comm,
                    &mut cache,
                    shape,
                    ReduceOp::Sum,
                    Scale::None,
                    layout,
                    buffers,
                )
                .unwrap();
                for (i, got) in out.chunks_exact(4).enumerate() {
                    let want: i32 = (0..ranks).map(|r| value(r, i)).sum();
                    assert_eq!(
                        i32::from_le_bytes(got.try_into().unwrap()),
                        want,
                        "element {i}"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn misaligned_buffers_of_any_length() {
    let ranks = 3;
    let p = Arc::new(plan(Algorithm::Stragglar, ranks, 0, 45, DataType::F64));
    let layout = layout_for(&[&p]);
    let id = comm_id();
    let threads: Vec<_> = (0..ranks)
        .map(|rank| {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut comm = HostComm::join(config(id, rank, ranks, layout)).unwrap();
                let ins: Vec<Vec<u8>> = (0..ranks)
                    .map(|r| {
                        (0..45)
                            .flat_map(|i| ((i * 3 + r) as f64).to_le_bytes())
                            .collect()
                    })
                    .collect();
                let want = simulate(&p, ReduceOp::Sum, &ins, &[Scale::None; 3]).swap_remove(rank);
                // Input at offset 3, output at offset 5: no 8-byte alignment anywhere.
                let mut input = vec![0u8; 3 + 360];
                input[3..].copy_from_slice(&ins[rank]);
                let mut output = vec![0u8; 5 + 360];
                let buffers = Buffers::OutOfPlace {
                    input: &input[3..],
                    output: &mut output[5..],
                };
                comm.all_reduce(&p, ReduceOp::Sum, Scale::None, buffers)
                    .unwrap();
                assert_eq!(&output[5..], &want[..]);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn call_records_summarise_arrivals() {
    use super::comm::CallRecord;
    let r = CallRecord::from_arrivals([100, 400, 250, 90].into_iter(), 1000);
    assert_eq!(
        (r.last_rank, r.lead_ns(), r.after_last_arrival_ns()),
        (1, 150, 600)
    );
    let tie = CallRecord::from_arrivals([7, 7].into_iter(), 7);
    assert_eq!((tie.last_rank, tie.lead_ns()), (1, 0));
}

#[test]
fn ranks_running_different_plans_fail_instead_of_misreading() {
    let ranks = 3;
    let a = Arc::new(plan(Algorithm::Stragglar, ranks, 2, 99, DataType::I32));
    let b = Arc::new(plan(Algorithm::Ring, ranks, 0, 99, DataType::I32));
    let layout = layout_for(&[&a, &b]);
    let id = comm_id();
    let threads: Vec<_> = (0..ranks)
        .map(|rank| {
            let p = if rank == 1 { b.clone() } else { a.clone() };
            std::thread::spawn(move || {
                let mut comm = HostComm::join(config(id, rank, ranks, layout)).unwrap();
                let mut buf = vec![1u8; 396];
                comm.all_reduce(&p, ReduceOp::Sum, Scale::None, Buffers::InPlace(&mut buf))
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(results.iter().all(Result::is_err), "{results:?}");
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(EngineError::Mismatch(_)))),
        "{results:?}"
    );
}

/// Each record carries the previous call's post-arrival time, the same on every rank: from
/// that call's last arrival to the finish of the rank that made it. A rank held back before a call makes the next record's value no smaller than the
/// work after it arrived, and never includes its delay.
#[test]
fn records_carry_the_previous_calls_post_arrival_time_alike_on_every_rank() {
    let ranks = 4;
    let plan = Arc::new(plan(Algorithm::Stragglar, ranks, 3, 4096, DataType::F32));
    let layout = layout_for(&[&plan]);
    let id = comm_id();
    let calls = 6;
    let threads: Vec<_> = (0..ranks)
        .map(|rank| {
            let plan = plan.clone();
            std::thread::spawn(move || {
                let mut comm = HostComm::join(config(id, rank, ranks, layout)).unwrap();
                let bytes = plan.count * plan.dtype.size();
                let mut records = Vec::new();
                for call in 0..calls {
                    if rank == 3 && call % 2 == 1 {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    let ins = input(rank, bytes, call);
                    let mut out = vec![0u8; bytes];
                    let buffers = Buffers::OutOfPlace {
                        input: &ins,
                        output: &mut out,
                    };
                    records.push(comm.all_reduce(&plan, ReduceOp::Sum, Scale::None, buffers));
                }
                records
                    .into_iter()
                    .map(|r| r.unwrap().unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let records: Vec<Vec<_>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for call in 0..calls {
        let first = records[0][call].previous_post_ns;
        assert_eq!(first.is_none(), call == 0, "call {call}");
        for rank in &records {
            assert_eq!(rank[call].previous_post_ns, first, "call {call}");
        }
        if call > 0 {
            let post = first.unwrap();
            // What the previous call's last rank measured on its own.
            let last = records[0][call - 1].last_rank;
            assert_eq!(
                post,
                records[last][call - 1].after_last_arrival_ns(),
                "call {call}"
            );
            // The 200 ms delay is before the arrival: not in the post-arrival time.
            assert!(post < 150_000_000, "call {call}: {post} ns");
        }
    }
}
