//! The `#[repr(C)]` encoding of one rank's plan that the CUDA kernels read.
//!
//! A [`PlanBlob`] is one contiguous, 8-byte aligned byte buffer: a [`RawPlanHeader`], then the
//! chunk ranges, this rank's steps, the steps' sources, every rank's value table, and the index
//! of each rank's first value. `cuda/stragglar_plan.h` is generated from these definitions by
//! cbindgen (tests/headers.rs), so kernel and host agree on the layout.

use super::{Plan, Step};

/// `RawPlanHeader::magic`: "SGPL".
pub const PLAN_MAGIC: u32 = 0x5347_504c;
/// `RawPlanHeader::version` of this layout.
pub const PLAN_VERSION: u32 = 1;
/// `RawStep::kind`: copy the caller's input into `IN`.
pub const STEP_COPY_IN: u32 = 0;
/// `RawStep::kind`: reduce the sources into a new value.
pub const STEP_COMBINE: u32 = 1;
/// `RawStep::kind`: copy a complete value.
pub const STEP_COPY: u32 = 2;
/// `RawStep::turn` of an unordered read.
pub const NO_TURN: u32 = u32::MAX;
/// `RawValue::offset` of a value that is not kept in the arena.
pub const VALUE_NOT_KEPT: u64 = u64::MAX;

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
    /// The `ncclDataType_t` of the elements.
    pub datatype: i32,
    /// Bytes per element.
    pub elem_size: u32,
    /// Elements in the caller's buffer.
    pub count: u64,
    /// Arena bytes this rank needs.
    pub arena_bytes: u64,
    pub chunk_count: u32,
    pub step_count: u32,
    pub source_count: u32,
    /// Values of all ranks together.
    pub value_count: u32,
    /// `RawChunk[chunk_count]`.
    pub chunks_at: u64,
    /// `RawStep[step_count]`.
    pub steps_at: u64,
    /// `RawSource[source_count]`.
    pub sources_at: u64,
    /// `RawValue[value_count]`, rank by rank.
    pub values_at: u64,
    /// `uint32_t[ranks]`: index of each rank's first value in the value array.
    pub value_bases_at: u64,
}

/// Element range `[start, end)` of one chunk.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawChunk {
    pub start: u64,
    pub end: u64,
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
    pub reserved: u32,
}

/// A value on some rank.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawSource {
    pub rank: u32,
    pub value: u32,
}

/// One value slot.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawValue {
    pub chunk: u32,
    pub reserved: u32,
    /// Byte offset in its rank's arena, or `VALUE_NOT_KEPT`.
    pub offset: u64,
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

/// Encodes `rank`'s program of `plan`.
pub fn encode(plan: &Plan, rank: usize) -> PlanBlob {
    let program = &plan.programs[rank];
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
            reserved: 0,
        });
        sources.extend(srcs.iter().map(|s| RawSource {
            rank: s.rank as u32,
            value: s.id as u32,
        }));
    }
    let mut values = Vec::new();
    let mut bases = Vec::new();
    for p in &plan.programs {
        bases.push(values.len() as u32);
        values.extend(p.values.iter().map(|v| RawValue {
            chunk: v.chunk as u32,
            reserved: 0,
            offset: v.offset.map_or(VALUE_NOT_KEPT, |o| o as u64),
        }));
    }
    let mut out = vec![0u8; std::mem::size_of::<RawPlanHeader>()];
    let chunks: Vec<RawChunk> = plan
        .chunks
        .iter()
        .map(|c| RawChunk {
            start: c.start as u64,
            end: c.end as u64,
        })
        .collect();
    let chunks_at = push(&mut out, &chunks, |c| words(&[c.start, c.end]));
    let steps_at = push(&mut out, &steps, |s| {
        words32(&[
            s.kind,
            s.chunk,
            s.first_source,
            s.source_count,
            s.out_value,
            s.complete,
            s.turn,
            s.reserved,
        ])
    });
    let sources_at = push(&mut out, &sources, |s| words32(&[s.rank, s.value]));
    let values_at = push(&mut out, &values, |v| {
        [words32(&[v.chunk, v.reserved]), words(&[v.offset])].concat()
    });
    let value_bases_at = push(&mut out, &bases, |b| b.to_le_bytes().to_vec());
    let header = RawPlanHeader {
        magic: PLAN_MAGIC,
        version: PLAN_VERSION,
        ranks: plan.ranks as u32,
        rank: rank as u32,
        datatype: plan.dtype.nccl_code(),
        elem_size: plan.dtype.size() as u32,
        count: plan.count as u64,
        arena_bytes: program.arena_bytes as u64,
        chunk_count: chunks.len() as u32,
        step_count: steps.len() as u32,
        source_count: sources.len() as u32,
        value_count: values.len() as u32,
        chunks_at,
        steps_at,
        sources_at,
        values_at,
        value_bases_at,
    };
    let h = [
        words32(&[header.magic, header.version, header.ranks, header.rank]),
        (header.datatype as u32).to_le_bytes().to_vec(),
        header.elem_size.to_le_bytes().to_vec(),
        words(&[header.count, header.arena_bytes]),
        words32(&[
            header.chunk_count,
            header.step_count,
            header.source_count,
            header.value_count,
        ]),
        words(&[
            header.chunks_at,
            header.steps_at,
            header.sources_at,
            header.values_at,
            header.value_bases_at,
        ]),
    ]
    .concat();
    out[..h.len()].copy_from_slice(&h);
    PlanBlob { bytes: out }
}
