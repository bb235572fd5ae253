//! Plans by message shape, and calls larger than the staging split into segments.
//!
//! A message whose plan needs more arena than the segments have is cut into equal segments
//! (element ranges on 16-byte boundaries), each run as its own call. What that costs: the
//! straggler's delay hides the ReduceScatter of the first segment only; every later segment
//! finds all ranks present and runs its whole plan exposed. Size the staging
//! (`STRAGGLAR_BUFFER_BYTES`) to the largest message that should keep the benefit.

use super::comm::{Buffers, CallRecord, EngineError, HostComm};
use super::segment::SegmentLayout;
use crate::plan::{chunk_range, PlanCache, Shape};
use crate::reduce::{ReduceOp, Scale};

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
    let parts = cache
        .segments_needed(shape, count, layout.arena_bytes)
        .map_err(EngineError::Mismatch)?;
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
    Ok(first.map(|record| CallRecord { parts, ..record }))
}
