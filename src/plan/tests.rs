//! Plans for every algorithm we execute, run through the interpreter against the reference.

use super::*;
use crate::reduce::{float16, DataType, ReduceOp, Scale};
use crate::schedule::{max_pieces_per_chunk, verify, Algorithm, PlanRequest};

/// Deterministic small values: integers in `-8..=8`, stored in the element type.
fn inputs(dtype: DataType, ranks: usize, count: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..ranks)
        .map(|_| {
            (0..count)
                .flat_map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let v = (x % 17) as i64 - 8;
                    encode_value(dtype, v)
                })
                .collect()
        })
        .collect()
}

fn encode_value(dtype: DataType, v: i64) -> Vec<u8> {
    match dtype {
        DataType::I8 => (v as i8).to_le_bytes().to_vec(),
        DataType::U8 => (v as u8).to_le_bytes().to_vec(),
        DataType::I32 => (v as i32).to_le_bytes().to_vec(),
        DataType::U32 => (v as u32).to_le_bytes().to_vec(),
        DataType::I64 => v.to_le_bytes().to_vec(),
        DataType::U64 => (v as u64).to_le_bytes().to_vec(),
        DataType::F16 => float16::f32_to_f16(v as f32).to_le_bytes().to_vec(),
        DataType::Bf16 => float16::f32_to_bf16(v as f32).to_le_bytes().to_vec(),
        DataType::F32 => (v as f32).to_le_bytes().to_vec(),
        DataType::F64 => (v as f64).to_le_bytes().to_vec(),
    }
}

fn as_f64(dtype: DataType, b: &[u8]) -> f64 {
    match dtype {
        DataType::F16 => float16::f16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
        DataType::Bf16 => float16::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
        DataType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        _ => f64::from_le_bytes(b.try_into().unwrap()),
    }
}

fn plan_for(
    algorithm: Algorithm,
    ranks: usize,
    straggler: usize,
    count: usize,
    dtype: DataType,
) -> Plan {
    let schedule = algorithm
        .schedule(&PlanRequest::new(ranks, straggler))
        .unwrap();
    verify(&schedule).unwrap();
    lower(&schedule, count, dtype).unwrap_or_else(|e| panic!("{algorithm:?} n={ranks}: {e}"))
}

fn check_exact(plan: &Plan, op: ReduceOp, seed: u64) {
    let ins = inputs(plan.dtype, plan.ranks, plan.count, seed);
    let scales = vec![Scale::None; plan.ranks];
    let outs = simulate(plan, op, &ins, &scales);
    let want = reference(plan.dtype, op, &ins, &scales);
    for (rank, out) in outs.iter().enumerate() {
        assert_eq!(
            out, &want,
            "rank {rank}, n={}, count={}, {:?} {:?}",
            plan.ranks, plan.count, plan.dtype, op
        );
    }
}

fn algorithms(ranks: usize) -> Vec<Algorithm> {
    let mut a = vec![Algorithm::Stragglar, Algorithm::Ring, Algorithm::Multicast];
    if ranks.is_power_of_two() {
        a.push(Algorithm::HalvingDoubling);
    }
    a
}

/// What the GPU kernel relies on when it reads is refused where a program breaks it: a rank
/// reading its `IN` chunk after writing that chunk's output (an in-place call overwrote it),
/// or reading a value it pushes; the order every lowered plan has passes.
#[test]
fn lowering_refuses_reads_the_kernel_cannot_serve() {
    let own_input = ValueRef { rank: 0, id: 0 };
    let peers = ValueRef { rank: 1, id: 1 };
    let program = |steps: Vec<Step>| RankProgram {
        steps,
        values: vec![
            Value {
                chunk: 0,
                offset: None,
            },
            Value {
                chunk: 0,
                offset: None,
            },
        ],
        arena_bytes: 0,
    };
    let combine = Step::Combine {
        chunk: 0,
        sources: vec![own_input, peers],
        out: 1,
        complete: true,
        turn: None,
    };
    let copy = Step::Copy {
        chunk: 0,
        source: peers,
        out: 1,
        turn: None,
    };
    let reader = RankProgram {
        steps: vec![Step::CopyIn],
        ..program(vec![])
    };
    let nothing_pushed = vec![vec![Vec::new(); 2]; 2];
    let check = |first: Step, then: Step, pushed: &[Vec<Vec<usize>>]| {
        let programs = [program(vec![Step::CopyIn, first, then]), reader.clone()];
        lower::check_reads(&programs, 1, pushed)
    };
    assert_eq!(
        check(combine.clone(), Step::CopyIn, &nothing_pushed),
        Ok(())
    );
    assert_eq!(
        check(copy, combine.clone(), &nothing_pushed),
        Err(LowerError::ReadsInputAfterOutput { rank: 0, chunk: 0 })
    );
    let mut pushed = nothing_pushed.clone();
    pushed[0][0] = vec![1];
    assert_eq!(
        check(combine, Step::CopyIn, &pushed),
        Err(LowerError::ReadsOwnPushedValue { rank: 0, chunk: 0 })
    );
}

#[test]
fn every_algorithm_and_size_reduces_every_element_exactly() {
    for ranks in 2..=12 {
        for straggler in [0, ranks - 1, ranks / 2] {
            for algorithm in algorithms(ranks) {
                for count in [0, 1, 3, ranks - 1, 37, 1001] {
                    let plan = plan_for(algorithm, ranks, straggler, count, DataType::I32);
                    check_exact(&plan, ReduceOp::Sum, (ranks * 1000 + count) as u64);
                }
            }
        }
    }
}

#[test]
fn every_data_type_and_op() {
    for dtype in DataType::ALL {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            for (ranks, straggler) in [(5, 2), (8, 7), (3, 0)] {
                let plan = plan_for(Algorithm::Stragglar, ranks, straggler, 77, dtype);
                check_exact(&plan, op, 7);
            }
        }
        let plan = plan_for(Algorithm::Ring, 6, 0, 50, dtype);
        check_exact(&plan, ReduceOp::Sum, 9);
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            for (ranks, straggler) in [(7, 2), (2, 0), (3, 2)] {
                let plan = plan_for(Algorithm::Multicast, ranks, straggler, 61, dtype);
                check_exact(&plan, op, 11);
            }
        }
    }
}

/// A multicast plan: the straggler combines every chunk once and every early rank copies it,
/// its reads unordered (no turns), each complete chunk pushed into the `n-1` early ranks (one
/// send reaching them all), each owner's chunk into the straggler.
#[test]
fn a_multicast_plan_combines_each_chunk_once_and_pushes_it_into_every_reader() {
    let (ranks, straggler) = (6, 4);
    let plan = plan_for(Algorithm::Multicast, ranks, straggler, 100, DataType::F32);
    let delivery = plan.delivery.as_ref().expect("a multicast plan");
    let pushed = &delivery.pushed_to;
    for (rank, program) in plan.programs.iter().enumerate() {
        for step in &program.steps {
            let (sources, turn) = step.reads();
            assert_eq!(turn, None, "rank {rank}: {step:?}");
            match step {
                Step::Combine { complete: true, .. } => assert_eq!(rank, straggler),
                Step::Copy { source, .. } => {
                    assert_eq!(source.rank, straggler);
                    let mut to = pushed[source.rank][source.id].clone();
                    to.sort();
                    let early: Vec<usize> = (0..ranks).filter(|&r| r != straggler).collect();
                    assert_eq!(to, early);
                }
                _ => {}
            }
            // After the ReduceScatter (pulled by each owner), every remote read is of a value
            // pushed into the reader.
            let after_reduce_scatter = rank == straggler || matches!(step, Step::Copy { .. });
            for source in sources
                .iter()
                .filter(|s| s.rank != rank && after_reduce_scatter)
            {
                assert!(
                    pushed[source.rank][source.id].contains(&rank),
                    "rank {rank} reads {source:?}, which is not pushed into it"
                );
            }
        }
    }
    let copies = plan.programs[straggler]
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Combine { complete: true, .. }))
        .count();
    assert_eq!(copies, ranks - 1, "one combine per chunk, on the straggler");
    let p2p = plan_for(Algorithm::Stragglar, ranks, straggler, 100, DataType::F32);
    assert_eq!(p2p.delivery, None);
    // Each owner's reduced chunk is pushed into the straggler: one value per early rank.
    let gathered: Vec<&Vec<usize>> = (0..ranks)
        .filter(|&r| r != straggler)
        .flat_map(|r| pushed[r].iter().filter(|to| !to.is_empty()))
        .collect();
    assert_eq!(gathered.len(), ranks - 1);
    assert!(gathered.iter().all(|to| to.as_slice() == [straggler]));
}

#[test]
fn avg_and_premulsum_agree_on_every_rank() {
    for dtype in [
        DataType::F16,
        DataType::Bf16,
        DataType::F32,
        DataType::F64,
        DataType::I32,
    ] {
        let plan = plan_for(Algorithm::Stragglar, 7, 3, 123, dtype);
        let ins = inputs(dtype, 7, 123, 3);
        for op in [ReduceOp::Avg, ReduceOp::PreMulSum] {
            let scales: Vec<Scale> = (0..7)
                .map(|r| {
                    let scalar = encode_value(dtype, r as i64 - 2);
                    let mut bytes = [0u8; 8];
                    bytes[..scalar.len()].copy_from_slice(&scalar);
                    Scale::for_op(op, dtype, 7, Some(bytes)).unwrap()
                })
                .collect();
            let outs = simulate(&plan, op, &ins, &scales);
            assert!(
                outs.iter().all(|o| o == &outs[0]),
                "{dtype:?} {op:?}: ranks disagree"
            );
            let want = reference(dtype, op, &ins, &scales);
            if dtype.is_float() {
                // Another summation order than the reference's: equal within a few ulps.
                let size = dtype.size();
                let ulp = match dtype {
                    DataType::F16 => 2f64.powi(-10),
                    DataType::Bf16 => 2f64.powi(-7),
                    DataType::F32 => 2f64.powi(-23),
                    _ => 2f64.powi(-52),
                };
                for (got, exp) in outs[0].chunks_exact(size).zip(want.chunks_exact(size)) {
                    let (g, e) = (as_f64(dtype, got), as_f64(dtype, exp));
                    assert!(
                        (g - e).abs() <= 8.0 * ulp * e.abs().max(1.0),
                        "{dtype:?} {op:?}: {g} vs {e}"
                    );
                }
            } else {
                assert_eq!(outs[0], want, "{op:?}");
            }
        }
    }
}

#[test]
fn stragglar_plans_stay_within_two_buffers_of_staging() {
    for ranks in [3, 4, 8, 16] {
        let count = 1 << 16;
        let plan = plan_for(Algorithm::Stragglar, ranks, ranks - 1, count, DataType::F32);
        let message = count * 4;
        assert!(
            plan.max_arena_bytes() <= 2 * message + 64 * ranks,
            "n={ranks}: {}",
            plan.max_arena_bytes()
        );
        // The straggler's program: copy-in, then only exchanges and copies.
        assert!(plan.programs[ranks - 1].steps.len() >= ranks - 1);
    }
}

#[test]
fn arena_slots_never_overlap_and_fit() {
    for ranks in [2, 3, 5, 8, 13] {
        for algorithm in algorithms(ranks) {
            let plan = plan_for(algorithm, ranks, ranks / 2, 1003, DataType::F16);
            let in_bytes = plan.count * plan.dtype.size();
            for (rank, program) in plan.programs.iter().enumerate() {
                let mut slots: Vec<(usize, usize)> = program
                    .values
                    .iter()
                    .enumerate()
                    .filter(|(id, _)| *id >= plan.chunks.len())
                    .filter_map(|(_, v)| v.offset.map(|o| (o, o + plan.chunk_bytes(v.chunk).len())))
                    .collect();
                slots.sort_unstable();
                for w in slots.windows(2) {
                    assert!(w[0].1 <= w[1].0, "n={ranks} rank {rank}: {w:?} overlap");
                }
                if let Some(first) = slots.first() {
                    assert!(first.0 >= in_bytes, "a slot overlaps IN");
                }
                assert!(slots
                    .iter()
                    .all(|s| s.1 <= program.arena_bytes && s.0 % ALIGN_BYTES == 0));
            }
        }
    }
}

#[test]
fn encoded_plans_carry_the_program() {
    let lowered = lowered_for(Algorithm::Stragglar, 6, 4);
    let plan = lowered.plan(1000, DataType::Bf16);
    for rank in 0..6 {
        let blob = lowered.blob(rank);
        assert_eq!(blob.bytes.len() % 8, 0);
        let word = |at: usize| u32::from_le_bytes(blob.bytes[at..at + 4].try_into().unwrap());
        let dword = |at: usize| u64::from_le_bytes(blob.bytes[at..at + 8].try_into().unwrap());
        assert_eq!(word(std::mem::offset_of!(RawPlanHeader, magic)), PLAN_MAGIC);
        assert_eq!(word(std::mem::offset_of!(RawPlanHeader, rank)), rank as u32);
        assert_eq!(
            word(std::mem::offset_of!(RawPlanHeader, version)),
            PLAN_VERSION
        );
        assert_eq!(
            word(std::mem::offset_of!(RawPlanHeader, chunk_count)) as usize,
            plan.chunks.len()
        );
        let steps = word(std::mem::offset_of!(RawPlanHeader, step_count)) as usize;
        assert_eq!(steps, plan.programs[rank].steps.len());
        let steps_at = dword(std::mem::offset_of!(RawPlanHeader, steps_at)) as usize;
        assert_eq!(steps_at % 8, 0);
        assert!(steps_at >= std::mem::size_of::<RawPlanHeader>());
        assert_eq!(word(steps_at), STEP_COPY_IN, "the first step copies in");
        let sources_at = dword(std::mem::offset_of!(RawPlanHeader, sources_at)) as usize;
        assert_eq!(
            sources_at - steps_at,
            (steps * std::mem::size_of::<RawStep>()).div_ceil(8) * 8,
            "step records are RawStep-sized"
        );
        let mut first_source = 0;
        for (i, step) in plan.programs[rank].steps.iter().enumerate() {
            let at = steps_at + i * std::mem::size_of::<RawStep>();
            let field = |f: usize| word(at + f);
            let (kind, chunk, sources, out, complete, turn) = match step {
                Step::CopyIn => (STEP_COPY_IN, 0, 0, 0, 0, None),
                Step::Combine {
                    chunk,
                    sources,
                    out,
                    complete,
                    turn,
                } => (
                    STEP_COMBINE,
                    *chunk,
                    sources.len(),
                    *out,
                    *complete as u32,
                    *turn,
                ),
                Step::Copy {
                    chunk, out, turn, ..
                } => (STEP_COPY, *chunk, 1, *out, 1, *turn),
            };
            assert_eq!(field(std::mem::offset_of!(RawStep, kind)), kind, "step {i}");
            assert_eq!(field(std::mem::offset_of!(RawStep, chunk)) as usize, chunk);
            assert_eq!(
                field(std::mem::offset_of!(RawStep, first_source)) as usize,
                first_source
            );
            assert_eq!(
                field(std::mem::offset_of!(RawStep, source_count)) as usize,
                sources
            );
            assert_eq!(
                field(std::mem::offset_of!(RawStep, out_value)) as usize,
                out
            );
            assert_eq!(field(std::mem::offset_of!(RawStep, complete)), complete);
            assert_eq!(
                field(std::mem::offset_of!(RawStep, turn)),
                turn.map_or(NO_TURN, |t| t as u32)
            );
            first_source += sources;
        }
        let values_at = dword(std::mem::offset_of!(RawPlanHeader, values_at)) as usize;
        let total: usize = plan.programs.iter().map(|p| p.values.len()).sum();
        assert_eq!(
            word(std::mem::offset_of!(RawPlanHeader, value_count)) as usize,
            total
        );
        assert!(values_at + total * std::mem::size_of::<RawValue>() <= blob.bytes.len());
    }
}

fn lowered_for(algorithm: Algorithm, ranks: usize, straggler: usize) -> Lowered {
    let schedule = algorithm
        .schedule(&PlanRequest::new(ranks, straggler))
        .unwrap();
    verify(&schedule).unwrap();
    lower_structure(&schedule).unwrap()
}

/// The value table of `rank`'s blob for `owner`, as (chunk, slot).
fn blob_values(blob: &PlanBlob, owner: usize) -> Vec<(u32, u32)> {
    let word = |at: usize| u32::from_le_bytes(blob.bytes[at..at + 4].try_into().unwrap());
    let dword = |at: usize| u64::from_le_bytes(blob.bytes[at..at + 8].try_into().unwrap());
    let ranks = word(std::mem::offset_of!(RawPlanHeader, ranks)) as usize;
    let values_at = dword(std::mem::offset_of!(RawPlanHeader, values_at)) as usize;
    let bases_at = dword(std::mem::offset_of!(RawPlanHeader, value_bases_at)) as usize;
    let total = word(std::mem::offset_of!(RawPlanHeader, value_count)) as usize;
    let base = |r: usize| {
        if r == ranks {
            total
        } else {
            word(bases_at + 4 * r) as usize
        }
    };
    (base(owner)..base(owner + 1))
        .map(|v| {
            let at = values_at + v * std::mem::size_of::<RawValue>();
            (word(at), word(at + 4))
        })
        .collect()
}

/// The reader ranks of `owner`'s values in `blob`, value by value.
fn blob_readers(blob: &PlanBlob, owner: usize) -> Vec<Vec<u32>> {
    let word = |at: usize| u32::from_le_bytes(blob.bytes[at..at + 4].try_into().unwrap());
    let dword = |at: usize| u64::from_le_bytes(blob.bytes[at..at + 8].try_into().unwrap());
    let values_at = dword(std::mem::offset_of!(RawPlanHeader, values_at)) as usize;
    let bases_at = dword(std::mem::offset_of!(RawPlanHeader, value_bases_at)) as usize;
    let readers_at = dword(std::mem::offset_of!(RawPlanHeader, readers_at)) as usize;
    let base = word(bases_at + 4 * owner) as usize;
    (0..blob_values(blob, owner).len())
        .map(|v| {
            let at = values_at + (base + v) * std::mem::size_of::<RawValue>();
            let (first, count) = (word(at + 8) as usize, word(at + 12) as usize);
            (first..first + count)
                .map(|i| word(readers_at + 4 * i))
                .collect()
        })
        .collect()
}

/// The plans the blob tests read: StragglAR at 4, 8 and 6 ranks (the last pipelined, 3 pieces a
/// chunk) and Ring at 5, as `(algorithm, ranks, pieces, lowered)`.
fn blob_cases() -> Vec<(Algorithm, usize, usize, Lowered)> {
    [
        (Algorithm::Stragglar, 4, 3, 1),
        (Algorithm::Stragglar, 8, 5, 1),
        (Algorithm::Stragglar, 6, 2, 3),
        (Algorithm::Ring, 5, 0, 1),
    ]
    .into_iter()
    .map(|(algorithm, ranks, straggler, pieces)| {
        let schedule = algorithm
            .schedule(&PlanRequest {
                pieces_per_chunk: pieces,
                ..PlanRequest::new(ranks, straggler)
            })
            .unwrap();
        verify(&schedule).unwrap();
        (
            algorithm,
            ranks,
            pieces,
            lower_structure(&schedule).unwrap(),
        )
    })
    .collect()
}

/// Every blob lists, for every value of every rank, exactly the other ranks that have a step
/// reading it (where the owner publishes its flag), ascending.
#[test]
fn blobs_list_every_reader_of_every_value() {
    for (algorithm, ranks, pieces, lowered) in blob_cases() {
        let plan = lowered.plan(1000, DataType::F32);
        let mut expected: Vec<Vec<Vec<u32>>> = plan
            .programs
            .iter()
            .map(|p| vec![Vec::new(); p.values.len()])
            .collect();
        for (reader, program) in plan.programs.iter().enumerate() {
            for step in &program.steps {
                for source in step.reads().0.iter().filter(|s| s.rank != reader) {
                    expected[source.rank][source.id].push(reader as u32);
                }
            }
        }
        for list in expected.iter_mut().flatten() {
            list.sort_unstable();
            list.dedup();
        }
        let read = expected.iter().flatten().filter(|l| !l.is_empty()).count();
        assert!(
            read > ranks,
            "{algorithm:?} n={ranks}: only {read} values read"
        );
        for rank in 0..ranks {
            let blob = lowered.blob(rank);
            for (owner, expected) in expected.iter().enumerate() {
                let label = format!("{algorithm:?} n={ranks} pieces {pieces}: blob {rank}");
                assert_eq!(
                    &blob_readers(&blob, owner),
                    expected,
                    "{label}, owner {owner}"
                );
                // A value somebody reads has a place (its owner publishes it from there).
                for (v, (_, slot)) in blob_values(&blob, owner).into_iter().enumerate() {
                    if !expected[v].is_empty() {
                        assert_ne!(slot, SLOT_NONE, "{label}: value {v} of {owner}");
                    }
                }
            }
        }
    }
}

/// The steps of one plan that read in turn: `(source, turn, reader, step index)`.
fn reads_in_turn(plan: &Plan) -> Vec<(usize, usize, usize, usize)> {
    let mut reads = Vec::new();
    for (reader, program) in plan.programs.iter().enumerate() {
        for (i, step) in program.steps.iter().enumerate() {
            let (sources, turn) = step.reads();
            let remote: Vec<usize> = sources
                .iter()
                .filter(|s| s.rank != reader)
                .map(|s| s.rank)
                .collect();
            if let Some(turn) = turn {
                assert_eq!(remote.len(), 1, "rank {reader} step {i}: one remote source");
                reads.push((remote[0], turn, reader, i));
            }
        }
    }
    reads
}

/// Every step that reads in turn names the rank reading its source's next send (the one it
/// hands the turn to), and every other step names none.
#[test]
fn blobs_name_the_reader_of_each_sources_next_send() {
    for (algorithm, ranks, pieces, lowered) in blob_cases() {
        let plan = lowered.plan(1000, DataType::F32);
        let reads = reads_in_turn(&plan);
        let mut expected: Vec<Vec<u32>> = plan
            .programs
            .iter()
            .map(|p| vec![NO_READER; p.steps.len()])
            .collect();
        for &(source, turn, reader, i) in &reads {
            let sends = reads.iter().filter(|r| r.0 == source).count();
            assert!(turn < sends, "rank {source}'s turns are 0..{sends}");
            if let Some(next) = reads.iter().find(|r| r.0 == source && r.1 == turn + 1) {
                expected[reader][i] = next.2 as u32;
            }
        }
        let handed = expected
            .iter()
            .flatten()
            .filter(|&&r| r != NO_READER)
            .count();
        assert!(
            handed + ranks >= reads.len() && handed > ranks,
            "{algorithm:?} n={ranks}: {handed} of {} reads hand a turn on",
            reads.len()
        );
        for (rank, expected) in expected.iter().enumerate() {
            let blob = lowered.blob(rank);
            let word = |at: usize| u32::from_le_bytes(blob.bytes[at..at + 4].try_into().unwrap());
            let dword = |at: usize| u64::from_le_bytes(blob.bytes[at..at + 8].try_into().unwrap());
            let steps_at = dword(std::mem::offset_of!(RawPlanHeader, steps_at)) as usize;
            for (i, &next) in expected.iter().enumerate() {
                let at = steps_at + i * std::mem::size_of::<RawStep>();
                assert_eq!(
                    word(at + std::mem::offset_of!(RawStep, next_reader)),
                    next,
                    "{algorithm:?} n={ranks} pieces {pieces}: rank {rank} step {i}"
                );
            }
        }
    }
}

/// One blob per rank serves every count and type: the place each value gets from its slot
/// (the kernel's rule) is where the plan of that count puts it, and the staging need is the
/// plan's.
#[test]
fn blobs_give_every_count_and_type_the_plans_arena_layout() {
    for (algorithm, ranks, straggler) in [
        (Algorithm::Stragglar, 4, 3),
        (Algorithm::Stragglar, 7, 2),
        (Algorithm::Ring, 5, 0),
    ] {
        let lowered = lowered_for(algorithm, ranks, straggler);
        let blobs: Vec<PlanBlob> = (0..ranks).map(|r| lowered.blob(r)).collect();
        let need = lowered.need();
        for dtype in [DataType::U8, DataType::Bf16, DataType::F32, DataType::F64] {
            for count in [0, 1, 5, 17, 1000, 4099, 65_537] {
                let plan = lowered.plan(count, dtype);
                let size = dtype.size();
                let in_bytes = (count * size).div_ceil(ALIGN_BYTES) * ALIGN_BYTES;
                let slot = slot_bytes(count, size, plan.chunks.len());
                assert_eq!(need.arena_bytes(count, dtype), plan.max_arena_bytes());
                assert_eq!(need.values, plan.total_values());
                for (rank, blob) in blobs.iter().enumerate() {
                    for owner in 0..ranks {
                        let table = blob_values(blob, owner);
                        let values = &plan.programs[owner].values;
                        assert_eq!(table.len(), values.len());
                        for (v, (&(chunk, k), value)) in table.iter().zip(values).enumerate() {
                            let label = format!(
                                "{algorithm:?} n={ranks} {dtype:?} x {count}: blob {rank}, value {v} of {owner}"
                            );
                            assert_eq!(chunk as usize, value.chunk, "{label}");
                            let place = match k {
                                SLOT_INPUT => Some(plan.chunk_bytes(value.chunk).start),
                                SLOT_NONE => None,
                                k => Some(in_bytes + k as usize * slot),
                            };
                            assert_eq!(place, value.offset, "{label}");
                            if let Some(at) = place {
                                let len = plan.chunk_bytes(value.chunk).len();
                                assert!(at + len <= plan.programs[owner].arena_bytes, "{label}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn lowering_rejects_a_schedule_that_leaves_a_rank_incomplete() {
    let mut schedule = Algorithm::Ring.schedule(&PlanRequest::new(4, 0)).unwrap();
    schedule.phases[0].rounds.pop();
    assert!(matches!(
        lower(&schedule, 64, DataType::F32),
        Err(LowerError::Incomplete { .. })
    ));
}

/// The kernel counts a rank's ordered sends in 16 bits: the need reports the most any rank has
/// (one per round it sends in, so far below the limit), counted from the programs' turns.
#[test]
fn the_need_counts_each_ranks_ordered_sends() {
    for (algorithm, ranks) in [
        (Algorithm::Stragglar, 5),
        (Algorithm::Ring, 6),
        (Algorithm::Stragglar, 64),
    ] {
        let lowered = lowered_for(algorithm, ranks, ranks - 1);
        let plan = lowered.plan(4096, DataType::F32);
        let turns = |step: &Step| match step {
            Step::Copy { turn, .. } | Step::Combine { turn, .. } => *turn,
            Step::CopyIn => None,
        };
        let most = plan
            .programs
            .iter()
            .flat_map(|p| p.steps.iter().filter_map(turns))
            .max()
            .map_or(0, |t| t + 1);
        let need = lowered.need();
        // A source's last send has the highest turn: the most turns of any source.
        assert_eq!(need.sends, most, "{algorithm:?} n={ranks}");
        assert!(most > 0);
        assert!(need.sends < 1 << 16);
    }
}

/// Pipelined StragglAR (each chunk cut into `k` pieces, numbered `c k + p`) lowers like any
/// schedule: every element reduced exactly once on every rank, for odd counts and every type
/// and op, and the staging stays within the plain plan's bound.
#[test]
fn pipelined_plans_reduce_every_element_exactly() {
    for ranks in [2, 4, 5, 8] {
        for pieces in [2, 3, 6] {
            if pieces > max_pieces_per_chunk(ranks) {
                continue;
            }
            let straggler = ranks / 2;
            let schedule = Algorithm::Stragglar
                .schedule(&PlanRequest {
                    ranks,
                    straggler,
                    pieces_per_chunk: pieces,
                })
                .unwrap();
            verify(&schedule).unwrap();
            for count in [0, 1, 3, 37, 1001, 4099] {
                let plan = lower(&schedule, count, DataType::I32)
                    .unwrap_or_else(|e| panic!("n={ranks} k={pieces}: {e}"));
                check_exact(
                    &plan,
                    ReduceOp::Sum,
                    (ranks * 100 + pieces * 10 + count) as u64,
                );
            }
            for dtype in [DataType::F16, DataType::Bf16, DataType::F64] {
                for op in [ReduceOp::Max, ReduceOp::Sum] {
                    let plan = lower(&schedule, 777, dtype).unwrap();
                    check_exact(&plan, op, 5);
                }
            }
            let count = 1 << 16;
            let plan = lower(&schedule, count, DataType::F32).unwrap();
            assert!(
                plan.max_arena_bytes() <= 2 * count * 4 + 64 * ranks * pieces,
                "n={ranks} k={pieces}: {}",
                plan.max_arena_bytes()
            );
        }
    }
}

/// A multicast plan's blob marks exactly the pushed values, and a pushed value's slot is its
/// own in every rank's arena: no value of any rank (pushed or kept) shares it, so a push lands
/// where nothing else lives, whichever readers it reaches (and a multicast store reaches them
/// all). Point-to-point plans push nothing.
#[test]
fn pushed_values_have_slots_no_other_value_of_any_rank_uses() {
    let word =
        |blob: &PlanBlob, at: usize| u32::from_le_bytes(blob.bytes[at..at + 4].try_into().unwrap());
    for (algorithm, ranks, straggler) in [
        (Algorithm::Multicast, 8, 7),
        (Algorithm::Multicast, 5, 1),
        (Algorithm::Multicast, 2, 0),
        (Algorithm::Stragglar, 6, 2),
    ] {
        let lowered = lowered_for(algorithm, ranks, straggler);
        let plan = lowered.plan(1000, DataType::F32);
        let pushed_to = plan.delivery.as_ref().map(|d| d.pushed_to.clone());
        let blob = lowered.blob(0);
        let dword = |at: usize| u64::from_le_bytes(blob.bytes[at..at + 8].try_into().unwrap());
        let values_at = dword(std::mem::offset_of!(RawPlanHeader, values_at)) as usize;
        let bases_at = dword(std::mem::offset_of!(RawPlanHeader, value_bases_at)) as usize;
        let mut pushed_slots = Vec::new();
        let mut kept_slots: Vec<Vec<u32>> = vec![Vec::new(); ranks];
        for (owner, values) in (0..ranks).map(|r| (r, blob_values(&blob, r))) {
            let base = word(&blob, bases_at + 4 * owner) as usize;
            for (v, &(_, slot)) in values.iter().enumerate() {
                let at = values_at + (base + v) * std::mem::size_of::<RawValue>();
                let pushed = word(&blob, at + std::mem::offset_of!(RawValue, pushed)) == 1;
                let expected = pushed_to.as_ref().is_some_and(|p| !p[owner][v].is_empty());
                assert_eq!(pushed, expected, "{algorithm:?} rank {owner} value {v}");
                if slot >= SLOT_INPUT {
                    assert!(!pushed, "a pushed value has a slot");
                } else if pushed {
                    pushed_slots.push(slot);
                } else {
                    kept_slots[owner].push(slot);
                }
            }
        }
        let need = lowered.need().slots as u32;
        for (rank, kept) in kept_slots.iter().enumerate() {
            let mut all: Vec<u32> = kept.iter().chain(&pushed_slots).copied().collect();
            let before = all.len();
            all.sort_unstable();
            all.dedup();
            assert_eq!(
                all.len(),
                before,
                "{algorithm:?}: two values share a slot on rank {rank}"
            );
            assert!(all.iter().all(|&k| k < need));
            // Every arena spans the slots that may land in it.
            let slot = slot_bytes(1000, 4, plan.chunks.len());
            if !pushed_slots.is_empty() {
                let spans = align_up_16(4000) + need as usize * slot;
                assert!(
                    plan.programs[rank].arena_bytes >= spans,
                    "rank {rank}'s arena spans every pushed slot"
                );
            }
        }
        assert_eq!(pushed_slots.is_empty(), algorithm != Algorithm::Multicast);
        // The values pushed to several readers have the last slots, one after another, from
        // the header's `multicast_slots_from` (what a multicast region holds).
        let mut several: Vec<u32> = (0..ranks)
            .flat_map(|owner| {
                let values = blob_values(&blob, owner);
                let readers = blob_readers(&blob, owner);
                let pushed_to = pushed_to.clone();
                values
                    .into_iter()
                    .zip(readers)
                    .enumerate()
                    .filter(move |(v, (_, readers))| {
                        readers.len() > 1
                            && pushed_to.as_ref().is_some_and(|p| !p[owner][*v].is_empty())
                    })
                    .map(|(_, ((_, slot), _))| slot)
            })
            .collect();
        several.sort_unstable();
        let from = word(
            &blob,
            std::mem::offset_of!(RawPlanHeader, multicast_slots_from),
        );
        match several.first() {
            None => assert_eq!(from, SLOT_NONE),
            Some(&first) => {
                assert_eq!(from, first);
                let expected: Vec<u32> = (first..need).collect();
                assert_eq!(several, expected, "{algorithm:?} {ranks} ranks");
            }
        }
    }
}

fn align_up_16(bytes: usize) -> usize {
    bytes.div_ceil(16) * 16
}
