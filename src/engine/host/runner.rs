//! Plans by message shape, and calls larger than the staging split into segments.
//!
//! A message whose plan needs more arena than the segments have is cut into equal segments
//! (element ranges on 16-byte boundaries), each run as its own call. What that costs: the
//! straggler's delay hides the ReduceScatter of the first segment only; every later segment
//! finds all ranks present and runs its whole plan exposed. Size the staging
//! (`STRAGGLAR_BUFFER_BYTES`) to the largest message that should keep the benefit.

use std::collections::HashMap;

use super::comm::{Buffers, CallRecord, EngineError, HostComm};
use super::segment::SegmentLayout;
use crate::plan::{chunk_range, lower_structure, Lowered, Plan};
use crate::reduce::{DataType, ReduceOp, Scale};
use crate::schedule::{verify, Algorithm, PlanRequest};

/// Which schedule a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    pub algorithm: Algorithm,
    pub ranks: usize,
    /// The straggler (ignored by algorithms without one).
    pub straggler: usize,
    pub dtype: DataType,
}

impl Shape {
    /// The plan a graph launch runs for `choice` (see `crate::gpu::choice`): StragglAR with
    /// straggler `choice` below `ranks`, Ring at `ranks` (its baseline, where Ring fits).
    pub fn of_choice(ranks: usize, choice: usize, dtype: DataType) -> Shape {
        Shape {
            algorithm: if choice < ranks {
                Algorithm::Stragglar
            } else {
                Algorithm::Ring
            },
            ranks,
            straggler: choice % ranks.max(1),
            dtype,
        }
    }
}

/// Plans by (shape, count), built on first use; identical on every rank.
#[derive(Default)]
pub struct PlanCache {
    plans: HashMap<(Shape, usize), Plan>,
    /// Verified schedules, lowered, by (algorithm, ranks, straggler): a new count only lays
    /// out the arenas.
    lowered: HashMap<(Algorithm, usize, usize), Lowered>,
    /// Segments needed by (shape, count, arena bytes): computed once per message shape.
    segments: HashMap<(Shape, usize, usize), usize>,
}

impl PlanCache {
    /// The schedule of `shape`, lowered for any count (its plans' programs, and the GPU's blobs).
    pub fn lowered(&mut self, shape: Shape) -> Result<&Lowered, String> {
        let key = (shape.algorithm, shape.ranks, shape.straggler);
        match self.lowered.entry(key) {
            std::collections::hash_map::Entry::Occupied(s) => Ok(s.into_mut()),
            std::collections::hash_map::Entry::Vacant(s) => {
                let schedule = shape
                    .algorithm
                    .schedule(&PlanRequest::new(shape.ranks, shape.straggler))
                    .map_err(|e| e.to_string())?;
                verify(&schedule).map_err(|e| format!("{e:?}"))?;
                Ok(s.insert(lower_structure(&schedule).map_err(|e| e.to_string())?))
            }
        }
    }

    /// The plan of `count` elements of `shape`.
    pub fn get(&mut self, shape: Shape, count: usize) -> Result<&Plan, String> {
        if !self.plans.contains_key(&(shape, count)) {
            let plan = self.lowered(shape)?.plan(count, shape.dtype);
            self.plans.insert((shape, count), plan);
        }
        Ok(&self.plans[&(shape, count)])
    }
}

/// The segment layout that fits every plan of `shapes` for messages up to `max_count`
/// elements without splitting, capped at `cap_bytes` of arena per parity.
pub fn layout_for(
    cache: &mut PlanCache,
    shapes: &[Shape],
    max_count: usize,
    cap_bytes: usize,
) -> Result<SegmentLayout, String> {
    let mut layout = SegmentLayout {
        flags_per_bank: 1,
        arena_bytes: 64,
    };
    for &shape in shapes {
        let plan = cache.get(shape, max_count)?;
        layout.flags_per_bank = layout.flags_per_bank.max(plan.max_values());
        layout.arena_bytes = layout
            .arena_bytes
            .max(plan.max_arena_bytes().min(cap_bytes));
    }
    Ok(layout)
}

/// How many segments `count` elements of `shape` need to fit `layout` (1 when the whole
/// message fits), computed once per message shape.
fn segments_needed(
    cache: &mut PlanCache,
    shape: Shape,
    count: usize,
    layout: SegmentLayout,
) -> Result<usize, String> {
    let key = (shape, count, layout.arena_bytes);
    if let Some(&parts) = cache.segments.get(&key) {
        return Ok(parts);
    }
    let whole = cache.get(shape, count)?.max_arena_bytes();
    let mut parts = whole.div_ceil(layout.arena_bytes.max(1)).max(1);
    // Alignment slack can leave a part slightly too big: add parts until every one fits.
    loop {
        let mut fits = true;
        for part in 0..parts {
            let len = chunk_range(count, shape.dtype.size(), parts, part).len();
            fits &= cache.get(shape, len)?.max_arena_bytes() <= layout.arena_bytes;
        }
        if fits {
            cache.segments.insert(key, parts);
            return Ok(parts);
        }
        parts += 1;
    }
}

/// Runs one AllReduce of `count` elements, split into segments when it does not fit; returns
/// the record of the first segment (the one whose ReduceScatter the delay can hide), `None` for
/// an empty call.
pub fn all_reduce(
    comm: &mut HostComm,
    cache: &mut PlanCache,
    shape: Shape,
    op: ReduceOp,
    scale: Scale,
    layout: SegmentLayout,
    buffers: Buffers<'_>,
) -> Result<Option<CallRecord>, EngineError> {
    let size = shape.dtype.size();
    let count = match &buffers {
        Buffers::InPlace(b) => b.len() / size,
        Buffers::OutOfPlace { input, .. } => input.len() / size,
    };
    let parts = segments_needed(cache, shape, count, layout).map_err(EngineError::Mismatch)?;
    if parts == 1 {
        let plan = cache.get(shape, count).map_err(EngineError::Mismatch)?;
        return comm.all_reduce(plan, op, scale, buffers);
    }
    let ranges = (0..parts).map(|part| chunk_range(count, size, parts, part));
    let mut first = None;
    match buffers {
        Buffers::InPlace(buffer) => {
            for r in ranges {
                let plan = cache.get(shape, r.len()).map_err(EngineError::Mismatch)?;
                let record = comm.all_reduce(
                    plan,
                    op,
                    scale,
                    Buffers::InPlace(&mut buffer[r.start * size..r.end * size]),
                )?;
                first = first.or(record);
            }
        }
        Buffers::OutOfPlace { input, output } => {
            for r in ranges {
                let plan = cache.get(shape, r.len()).map_err(EngineError::Mismatch)?;
                let bytes = r.start * size..r.end * size;
                let buffers = Buffers::OutOfPlace {
                    input: &input[bytes.clone()],
                    output: &mut output[bytes],
                };
                let record = comm.all_reduce(plan, op, scale, buffers)?;
                first = first.or(record);
            }
        }
    }
    Ok(first)
}
