//! Plans: a schedule lowered to the program each rank executes, for one message shape.
//!
//! A [`Plan`] depends on the schedule, the element count and the data type, not on the op or
//! the buffers, so it can be built once and reused for every call of that shape. Both engines
//! execute the same plan; the host engine is the reference the GPU engine is checked against.
//!
//! The execution model (single assignment): every rank owns an *arena* in shared memory. Its
//! first region, `IN`, receives the rank's own input (one value per chunk). Every later value
//! (a partial or a final chunk) is written once per call into its own slot of the producing
//! rank's arena, and one flag per value says which call wrote it. A step reads values on any
//! rank (waiting for their flags), computes, and writes a new value on its own rank, the
//! caller's output, or both. Nothing a peer may read is ever overwritten within a call.

#![forbid(unsafe_code)]

mod cache;
mod encode;
mod layout;
mod lower;
mod simulate;

pub use cache::{PlanCache, Shape};
pub use encode::{
    PlanBlob, RawPlanHeader, RawSource, RawStep, RawValue, NO_READER, NO_TURN, PLAN_MAGIC,
    PLAN_VERSION, SLOT_INPUT, SLOT_NONE, STEP_COMBINE, STEP_COPY, STEP_COPY_IN,
};
pub use layout::{chunk_range, chunk_ranges, slot_bytes, ElementRange, ALIGN_BYTES};
pub use lower::{lower, lower_structure, ArenaNeed, LowerError, Lowered};
pub use simulate::{reference, simulate};

use crate::reduce::DataType;

/// A value on some rank: an index into that rank's value table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ValueRef {
    pub rank: usize,
    pub id: usize,
}

/// One value slot of a rank's arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Value {
    /// The chunk it holds a version of.
    pub chunk: usize,
    /// Byte offset in the rank's arena, 16-byte aligned; `None` for a value nobody reads
    /// later (it goes only to the caller's output).
    pub offset: Option<usize>,
}

/// One step of a rank's program.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Step {
    /// Copies the caller's input into `IN` (values `0..chunks`), chunk by chunk, applying the
    /// op's copy-in scaling, raising each chunk's flag as soon as it is in. Always first.
    CopyIn,
    /// `out = sources[0] ⊕ sources[1] ⊕ ...` for `chunk`, in this order (one rounding for
    /// fp16/bf16). `complete` means the result holds every rank's contribution: it gets the
    /// op's finishing touch and goes to the caller's output.
    Combine {
        chunk: usize,
        sources: Vec<ValueRef>,
        out: usize,
        complete: bool,
        /// See [`Turn`].
        turn: Turn,
    },
    /// Copies `source` (a complete value) for `chunk` into this rank's value `out` (when kept)
    /// and the caller's output.
    Copy {
        chunk: usize,
        source: ValueRef,
        out: usize,
        /// See [`Turn`].
        turn: Turn,
    },
}

impl Step {
    /// The values this step reads (none for `CopyIn`) and its [`Turn`].
    pub fn reads(&self) -> (&[ValueRef], Turn) {
        match self {
            Step::CopyIn => (&[], None),
            Step::Combine { sources, turn, .. } => (sources, *turn),
            Step::Copy { source, turn, .. } => (std::slice::from_ref(source), *turn),
        }
    }
}

/// Where a step's remote read stands in its source's sends. `Some(k)`: it is the source's
/// `k`-th send of the call (in schedule order), and waits until the source has served the
/// `k` before it, so every send port serves in round order as the round model assumes.
/// `None`: unordered (the direct-pull ReduceScatter, which runs before the straggler arrives).
pub type Turn = Option<usize>;

/// The program of one rank: steps in order, its value table and its arena size.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RankProgram {
    pub steps: Vec<Step>,
    /// Values `0..chunks` are the `IN` chunks; the rest are produced by steps.
    pub values: Vec<Value>,
    /// Bytes of arena this rank needs (a multiple of [`ALIGN_BYTES`]).
    pub arena_bytes: usize,
}

/// How the values of a multicast plan travel, for the engines' link emulation (the data moves
/// as in any plan: readers wait for the value's flag and read it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// `[rank][value]`: the ranks the value is written into as soon as it is made, instead of
    /// each fetching it later: the gather's chunk into the straggler before it arrives, and
    /// each complete chunk the straggler multicasts into every early rank, one send from its
    /// port reaching them all. Empty for values read in place.
    pub pushed_to: Vec<Vec<Vec<usize>>>,
}

/// A lowered schedule for `count` elements of `dtype` on `ranks` ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub ranks: usize,
    /// The straggler's physical rank, if the algorithm has one.
    pub straggler: Option<usize>,
    pub count: usize,
    pub dtype: DataType,
    /// Element range of each chunk: disjoint, in order, covering `0..count` exactly.
    pub chunks: Vec<ElementRange>,
    /// One program per physical rank.
    pub programs: Vec<RankProgram>,
    /// How a multicast schedule's values travel; `None` for point-to-point plans, in which
    /// every read is a transfer of its own, made by the reader.
    pub delivery: Option<Delivery>,
    /// A hash of everything above, the same in every process running this binary: ranks
    /// compare it to make sure they all run the same plan in a call.
    pub fingerprint: u64,
}

impl Plan {
    /// Byte range of `chunk` within a buffer of `count` elements (also its place in `IN`).
    pub fn chunk_bytes(&self, chunk: usize) -> std::ops::Range<usize> {
        let r = self.chunks[chunk];
        r.start * self.dtype.size()..r.end * self.dtype.size()
    }

    /// The largest arena any rank needs, in bytes.
    pub fn max_arena_bytes(&self) -> usize {
        self.programs
            .iter()
            .map(|p| p.arena_bytes)
            .max()
            .unwrap_or(0)
    }

    /// The largest value table of any rank (the host engine's flags per bank).
    pub fn max_values(&self) -> usize {
        self.programs
            .iter()
            .map(|p| p.values.len())
            .max()
            .unwrap_or(0)
    }

    /// Values of all ranks together (the GPU kernel's flags per parity, an inbox with a word
    /// for every value of any rank).
    pub fn total_values(&self) -> usize {
        self.programs.iter().map(|p| p.values.len()).sum()
    }
}

#[cfg(test)]
mod tests;
