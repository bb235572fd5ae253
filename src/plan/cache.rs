//! Plans by shape and count, built once and shared by every call of that shape.

use std::collections::HashMap;

use super::{chunk_range, lower_structure, Lowered, Plan};
use crate::detect::Finish;
use crate::reduce::DataType;
use crate::schedule::{verify, Algorithm, PlanRequest};

/// Which schedule a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    pub algorithm: Algorithm,
    pub ranks: usize,
    /// The straggler (ignored by algorithms without one).
    pub straggler: usize,
    pub dtype: DataType,
    /// Pieces per chunk of a pipelined StragglAR schedule (`1`: the plain one; always `1` for
    /// other algorithms).
    pub pieces: usize,
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
            pieces: 1,
        }
    }

    /// The same choice with StragglAR finished by `finish`: point to point, its chunks cut
    /// into pieces, or by one multicast (`Algorithm::Multicast`, unpipelined); any other shape
    /// unchanged.
    pub fn with_finish(mut self, finish: Finish) -> Shape {
        match finish {
            Finish::Pieces(pieces) => self.with_pieces(pieces),
            Finish::Multicast if self.algorithm == Algorithm::Stragglar => {
                self.algorithm = Algorithm::Multicast;
                self.pieces = 1;
                self
            }
            Finish::Multicast => self,
        }
    }

    /// The same shape with each chunk cut into `pieces` pieces when it is StragglAR (other
    /// algorithms stay unpipelined).
    pub fn with_pieces(mut self, pieces: usize) -> Shape {
        if self.algorithm == Algorithm::Stragglar {
            self.pieces = pieces.max(1);
        }
        self
    }
}

/// Plans by (shape, count), built on first use; identical on every rank.
#[derive(Default, Clone)]
pub struct PlanCache {
    plans: HashMap<(Shape, usize), Plan>,
    /// Verified schedules, lowered, by (algorithm, ranks, straggler, pieces): a new count only
    /// lays out the arenas.
    lowered: HashMap<(Algorithm, usize, usize, usize), Lowered>,
    /// Segments needed by (shape, count, arena bytes): computed once per message shape.
    segments: HashMap<(Shape, usize, usize), usize>,
}

impl PlanCache {
    /// The schedule of `shape`, lowered for any count (its plans' programs, and the GPU's blobs).
    pub fn lowered(&mut self, shape: Shape) -> Result<&Lowered, String> {
        let key = (shape.algorithm, shape.ranks, shape.straggler, shape.pieces);
        match self.lowered.entry(key) {
            std::collections::hash_map::Entry::Occupied(s) => Ok(s.into_mut()),
            std::collections::hash_map::Entry::Vacant(s) => {
                let request = PlanRequest {
                    pieces_per_chunk: shape.pieces,
                    ..PlanRequest::new(shape.ranks, shape.straggler)
                };
                let schedule = shape
                    .algorithm
                    .schedule(&request)
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

    /// How many equal segments `count` elements of `shape` need so that each one's plan fits
    /// `arena_bytes` per parity (1 when the whole message fits), computed once per shape.
    pub fn segments_needed(
        &mut self,
        shape: Shape,
        count: usize,
        arena_bytes: usize,
    ) -> Result<usize, String> {
        let cache = self;
        let key = (shape, count, arena_bytes);
        if let Some(&parts) = cache.segments.get(&key) {
            return Ok(parts);
        }
        let whole = cache.get(shape, count)?.max_arena_bytes();
        let mut parts = whole.div_ceil(arena_bytes.max(1)).max(1);
        // Alignment slack can leave a part slightly too big: add parts until every one fits.
        loop {
            let mut fits = true;
            for part in 0..parts {
                let len = chunk_range(count, shape.dtype.size(), parts, part).len();
                fits &= cache.get(shape, len)?.max_arena_bytes() <= arena_bytes;
            }
            if fits {
                cache.segments.insert(key, parts);
                return Ok(parts);
            }
            parts += 1;
        }
    }
}
