//! The `#[repr(C)]` encoding of one rank's program that the CUDA kernels read.
//!
//! A [`PlanBlob`] is one contiguous, 8-byte aligned byte buffer: a [`RawPlanHeader`], then this
//! rank's steps, the steps' sources, every rank's value table (with each value's readers), the
//! index of each rank's first value, and the reader ranks the value table points into. A blob
//! holds no count, type or byte offset: the launch gives the count and the type, and the kernel
//! derives each chunk's range and each value's place from them exactly as `super::layout` does
//! (`chunk_range`, `slot_bytes`). So one blob per rank and schedule serves every message size,
//! uploaded once. `cuda/stragglar_plan.h` is generated from these
//! definitions by cbindgen (tests/headers.rs), so kernel and host agree on the layout.

use super::{RankProgram, Step};

/// `RawPlanHeader::magic`: "SGPL".
pub const PLAN_MAGIC: u32 = 0x5347_504c;
/// `RawPlanHeader::version` of this layout.
pub const PLAN_VERSION: u32 = 5;
/// `RawStep::kind`: copy the caller's input into `IN`.
pub const STEP_COPY_IN: u32 = 0;
/// `RawStep::kind`: reduce the sources into a new value.
pub const STEP_COMBINE: u32 = 1;
/// `RawStep::kind`: copy a complete value.
pub const STEP_COPY: u32 = 2;
/// `RawStep::turn` of an unordered read.
pub const NO_TURN: u32 = u32::MAX;
/// `RawStep::next_reader` when no rank reads the source's next send in turn.
pub const NO_READER: u32 = u32::MAX;
/// `RawValue::slot` of an `IN` chunk: it lives at its chunk's place at the arena's start.
pub const SLOT_INPUT: u32 = u32::MAX - 1;
/// `RawValue::slot` of a value that is not kept in the arena (nobody reads it).
pub const SLOT_NONE: u32 = u32::MAX;

/// The header at byte 0 of a blob. Offsets are in bytes from the blob's start.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawPlanHeader {
    pub magic: u32,
    pub version: u32,
    /// Ranks in the communicator.
    pub ranks: u32,
    /// The rank whose steps this blob holds.
    pub rank: u32,
    /// Chunks the message is cut into (`chunk_range` of the launch's count and type).
    pub chunk_count: u32,
    pub step_count: u32,
    pub source_count: u32,
    /// Values of all ranks together.
    pub value_count: u32,
    /// Slots of this rank's values that are kept (its own, and those it pushes); a multicast
    /// plan's arenas span every pushed value's slot besides (see `Lowered`).
    pub slot_count: u32,
    /// The first of the slots that hold values pushed to several readers (numbered last, one
    /// after another: see `Lowered`), which a launch with a multicast arena
    /// (`RawLaunch::multicast_arena`) keeps there instead, slot `k` at `k` minus this many
    /// slots from its start; `SLOT_NONE` when the plan pushes no value to several readers.
    pub multicast_slots_from: u32,
    /// `RawStep[step_count]`.
    pub steps_at: u64,
    /// `RawSource[source_count]`.
    pub sources_at: u64,
    /// `RawValue[value_count]`, rank by rank.
    pub values_at: u64,
    /// `uint32_t[ranks]`: index of each rank's first value in the value array.
    pub value_bases_at: u64,
    /// `uint32_t[]`: the ranks that read each value (`RawValue::first_reader`), ascending.
    pub readers_at: u64,
}

/// One step. Sources are `sources[first_source .. first_source + source_count]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawStep {
    /// `STEP_COPY_IN`, `STEP_COMBINE` or `STEP_COPY`.
    pub kind: u32,
    pub chunk: u32,
    pub first_source: u32,
    pub source_count: u32,
    /// The value this step writes on its own rank (index in the rank's own table).
    pub out_value: u32,
    /// 1 when the result holds every contribution (finish it, write it to the output).
    pub complete: u32,
    /// The remote read's place in its source's sends (`plan::Turn`), or `NO_TURN`.
    pub turn: u32,
    /// With a turn: the rank that reads the same source's next send (turn + 1), into whose
    /// staging this rank writes that turn once its own read is done (`RawPeer::served`), or
    /// `NO_READER` for the source's last send. `NO_READER` without a turn.
    pub next_reader: u32,
}

/// A value on some rank.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawSource {
    pub rank: u32,
    pub value: u32,
}

/// One value of some rank.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawValue {
    pub chunk: u32,
    /// `SLOT_INPUT`, `SLOT_NONE`, or its slot `k`: arena bytes
    /// `[IN + k * slot, IN + (k + 1) * slot)`, where `IN` is the count's bytes rounded up to 16
    /// and `slot` is `slot_bytes` of the count.
    pub slot: u32,
    /// The other ranks whose steps read this value: `readers[first_reader ..
    /// first_reader + reader_count]`. The owner publishes the value into each reader's
    /// staging (its flag there), so a reader's wait polls its own memory.
    pub first_reader: u32,
    pub reader_count: u32,
    /// 1 when the owner writes the value into each reader's own arena, at this same slot, as
    /// it makes it (a multicast plan's push, `Plan::delivery`), so a reader reads it in its own
    /// memory; 0 when readers read it in the owner's arena.
    pub pushed: u32,
}

/// One rank's encoded plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanBlob {
    /// The bytes, 8-byte aligned in length; copy them to an 8-byte aligned address.
    pub bytes: Vec<u8>,
}

fn push<T: Copy>(out: &mut Vec<u8>, items: &[T], to_bytes: impl Fn(&T) -> Vec<u8>) -> u64 {
    let at = out.len() as u64;
    for item in items {
        out.extend(to_bytes(item));
    }
    while out.len() % 8 != 0 {
        out.push(0);
    }
    at
}

fn words(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn words32(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `readers[r][v]`: the ranks other than `r` whose steps read value `v` of rank `r`,
/// ascending and without repeats.
fn readers_of(programs: &[RankProgram]) -> Vec<Vec<Vec<usize>>> {
    let mut readers: Vec<Vec<Vec<usize>>> = programs
        .iter()
        .map(|p| vec![Vec::new(); p.values.len()])
        .collect();
    for (reader, program) in programs.iter().enumerate() {
        for step in &program.steps {
            for source in step.reads().0.iter().filter(|s| s.rank != reader) {
                let list = &mut readers[source.rank][source.id];
                if !list.contains(&reader) {
                    list.push(reader);
                }
            }
        }
    }
    for list in readers.iter_mut().flatten() {
        list.sort_unstable();
    }
    readers
}

/// The one source of a step with a turn that is not the reader's own value (lowering reads one
/// rank per transfer: a copy's source, or the other operand of a reduce).
fn remote_source(sources: &[super::ValueRef], reader: usize) -> Option<usize> {
    let mut remote = sources.iter().filter(|s| s.rank != reader);
    let source = remote.next()?;
    // The kernel hands every remote source of the step the same next reader: one only.
    assert!(
        remote.next().is_none(),
        "a read in turn has one remote source"
    );
    Some(source.rank)
}

/// `(source, turn) -> reader`: which rank's step reads `source`'s send number `turn` (each send
/// has one reader).
fn turn_readers(programs: &[RankProgram]) -> std::collections::HashMap<(usize, usize), usize> {
    let mut readers = std::collections::HashMap::new();
    for (reader, program) in programs.iter().enumerate() {
        for step in &program.steps {
            let (sources, Some(turn)) = step.reads() else {
                continue;
            };
            if let Some(source) = remote_source(sources, reader) {
                let before = readers.insert((source, turn), reader);
                debug_assert!(before.is_none(), "send {turn} of rank {source} read twice");
            }
        }
    }
    readers
}

/// Encodes `rank`'s program: `slots[r][v]` is the arena slot of value `v` of rank `r`
/// (`None` for `IN` chunks, values `0..chunks`, and for values nobody reads); `pushed[r][v]`
/// says that its owner writes it into its readers' arenas (see [`RawValue::pushed`]).
pub(super) fn encode_programs(
    chunks: usize,
    programs: &[RankProgram],
    slots: &[Vec<Option<usize>>],
    pushed: &[Vec<bool>],
    rank: usize,
) -> PlanBlob {
    let program = &programs[rank];
    let turn_readers = turn_readers(programs);
    let mut steps = Vec::new();
    let mut sources = Vec::new();
    for step in &program.steps {
        let (kind, chunk, srcs, out, complete, turn) = match step {
            Step::CopyIn => (STEP_COPY_IN, 0, vec![], 0, false, None),
            Step::Combine {
                chunk,
                sources,
                out,
                complete,
                turn,
            } => (
                STEP_COMBINE,
                *chunk,
                sources.clone(),
                *out,
                *complete,
                *turn,
            ),
            Step::Copy {
                chunk,
                source,
                out,
                turn,
            } => (STEP_COPY, *chunk, vec![*source], *out, true, *turn),
        };
        steps.push(RawStep {
            kind,
            chunk: chunk as u32,
            first_source: sources.len() as u32,
            source_count: srcs.len() as u32,
            out_value: out as u32,
            complete: complete as u32,
            turn: turn.map_or(NO_TURN, |t| t as u32),
            next_reader: turn
                .and_then(|t| {
                    let source = remote_source(&srcs, rank)?;
                    turn_readers.get(&(source, t + 1)).copied()
                })
                .map_or(NO_READER, |r| r as u32),
        });
        sources.extend(srcs.iter().map(|s| RawSource {
            rank: s.rank as u32,
            value: s.id as u32,
        }));
    }
    let readers = readers_of(programs);
    let mut values = Vec::new();
    let mut bases = Vec::new();
    let mut reader_ranks = Vec::new();
    for (((p, slots), readers), pushed) in programs.iter().zip(slots).zip(&readers).zip(pushed) {
        bases.push(values.len() as u32);
        for (id, (((v, slot), readers), &pushed)) in p
            .values
            .iter()
            .zip(slots)
            .zip(readers)
            .zip(pushed)
            .enumerate()
        {
            values.push(RawValue {
                chunk: v.chunk as u32,
                slot: match slot {
                    _ if id < chunks => SLOT_INPUT,
                    Some(k) => *k as u32,
                    None => SLOT_NONE,
                },
                first_reader: reader_ranks.len() as u32,
                reader_count: readers.len() as u32,
                pushed: pushed as u32,
            });
            reader_ranks.extend(readers.iter().map(|&r| r as u32));
        }
    }
    let multicast_slots_from = values
        .iter()
        .filter(|v| v.pushed == 1 && v.reader_count > 1)
        .map(|v| v.slot)
        .min()
        .unwrap_or(SLOT_NONE);
    let mut out = vec![0u8; std::mem::size_of::<RawPlanHeader>()];
    let steps_at = push(&mut out, &steps, |s| {
        words32(&[
            s.kind,
            s.chunk,
            s.first_source,
            s.source_count,
            s.out_value,
            s.complete,
            s.turn,
            s.next_reader,
        ])
    });
    let sources_at = push(&mut out, &sources, |s| words32(&[s.rank, s.value]));
    let values_at = push(&mut out, &values, |v| {
        words32(&[v.chunk, v.slot, v.first_reader, v.reader_count, v.pushed])
    });
    let value_bases_at = push(&mut out, &bases, |b| b.to_le_bytes().to_vec());
    let readers_at = push(&mut out, &reader_ranks, |r| r.to_le_bytes().to_vec());
    let header = RawPlanHeader {
        magic: PLAN_MAGIC,
        version: PLAN_VERSION,
        ranks: programs.len() as u32,
        rank: rank as u32,
        chunk_count: chunks as u32,
        step_count: steps.len() as u32,
        source_count: sources.len() as u32,
        value_count: values.len() as u32,
        slot_count: slots[rank].iter().flatten().count() as u32,
        multicast_slots_from,
        steps_at,
        sources_at,
        values_at,
        value_bases_at,
        readers_at,
    };
    let h = [
        words32(&[
            header.magic,
            header.version,
            header.ranks,
            header.rank,
            header.chunk_count,
            header.step_count,
            header.source_count,
            header.value_count,
            header.slot_count,
            header.multicast_slots_from,
        ]),
        words(&[
            header.steps_at,
            header.sources_at,
            header.values_at,
            header.value_bases_at,
            header.readers_at,
        ]),
    ]
    .concat();
    debug_assert_eq!(h.len(), std::mem::size_of::<RawPlanHeader>());
    out[..h.len()].copy_from_slice(&h);
    PlanBlob { bytes: out }
}
