//! Lowering a verified schedule to per-rank programs.
//!
//! The `reduce_scatter` phase runs as one direct-pull step per chunk: the rank that owns the
//! chunk at the end of the phase reduces every early rank's `IN` chunk in ascending rank order
//! (the same result and bandwidth as the rounds the schedule lists, one rounding instead of
//! `n-2`). Every other phase runs transfer by transfer: a copy pulls the source's value, a
//! reduce combines the destination's value with the source's. The two operands of a reduce
//! are put in a canonical order (the one whose contributions include the lowest rank first),
//! so when two ranks compute the same final chunk (the exchange with the straggler) they
//! compute it bit for bit alike, even for max/min of signed zeros. In a multicast schedule the
//! reads after the ReduceScatter are unordered (no turns), and every one of them is a push
//! (`Delivery::pushed_to`): the value is written into its readers as it is made, one send of
//! its producer reaching them all.

use std::fmt;
use std::hash::{Hash, Hasher};

use super::encode::{encode_programs, PlanBlob};
use super::layout::{align_up, chunk_ranges, slot_bytes};
use super::{Delivery, Plan, RankProgram, Step, Turn, Value, ValueRef};
use crate::reduce::DataType;
use crate::schedule::{Contributions, PhaseKind, Schedule};

/// Why a schedule cannot be executed by the engines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LowerError {
    /// A transfer reads a partial value that the direct-pull ReduceScatter does not produce.
    ReadsUnmaterialised { rank: usize, chunk: usize },
    /// A reduce would count a contribution twice.
    DoubleCount { rank: usize, chunk: usize },
    /// No early rank holds the whole ReduceScatter of a chunk at the end of that phase.
    NoOwner { chunk: usize },
    /// Some rank ends without the complete value of some chunk.
    Incomplete { rank: usize, chunk: usize },
    /// A rank reads its own `IN` chunk after writing that chunk's output: the GPU kernel reads
    /// an `IN` chunk that no peer reads in the caller's input, which an in-place call has then
    /// overwritten.
    ReadsInputAfterOutput { rank: usize, chunk: usize },
    /// A rank reads a value it pushes into its readers: the GPU kernel keeps such a value in
    /// the multicast region, where the owner's own reads are not ordered after its stores.
    ReadsOwnPushedValue { rank: usize, chunk: usize },
}

impl fmt::Display for LowerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LowerError::ReadsUnmaterialised { rank, chunk } => {
                write!(f, "a transfer reads rank {rank}'s ReduceScatter partial of chunk {chunk}, which is not materialised")
            }
            LowerError::NoOwner { chunk } => write!(
                f,
                "no early rank owns chunk {chunk} after the ReduceScatter"
            ),
            LowerError::DoubleCount { rank, chunk } => write!(
                f,
                "rank {rank} would count a contribution twice in chunk {chunk}"
            ),
            LowerError::Incomplete { rank, chunk } => {
                write!(f, "rank {rank} ends without the complete chunk {chunk}")
            }
            LowerError::ReadsInputAfterOutput { rank, chunk } => write!(
                f,
                "rank {rank} reads its input chunk {chunk} after writing that chunk's output"
            ),
            LowerError::ReadsOwnPushedValue { rank, chunk } => {
                write!(f, "rank {rank} reads its own pushed value of chunk {chunk}")
            }
        }
    }
}

impl std::error::Error for LowerError {}

/// What a rank currently holds for one chunk.
#[derive(Clone)]
struct Held {
    value: ValueRef,
    set: Contributions,
    /// The lowest rank in `set`, the canonical-order key.
    lowest: usize,
}

/// What one step produces.
struct Produced {
    sources: Vec<ValueRef>,
    set: Contributions,
    lowest: usize,
    /// A copy of `sources[0]` rather than a combination.
    copy: bool,
    turn: Turn,
}

/// Lowering state: the programs being built and what every rank holds.
struct Lowering {
    ranks: usize,
    /// Chunks of the schedule; values `0..chunks` of every rank are its `IN` chunks.
    chunks: usize,
    programs: Vec<RankProgram>,
    /// `held[rank][chunk]`; `None` once a partial is not materialised.
    held: Vec<Vec<Option<Held>>>,
    /// `reads[rank][value]`: some later step reads this value.
    reads: Vec<Vec<bool>>,
    /// `sends[rank]`: transfer-by-transfer sends of `rank` so far (its next turn).
    sends: Vec<usize>,
    /// `output_written[rank][chunk]`: the rank obtained this chunk's complete value.
    output_written: Vec<Vec<bool>>,
    /// Whether the schedule's sends are multicast (their reads take no turns).
    multicast: bool,
    /// `pushed_to[rank][value]`: see [`Delivery::pushed_to`].
    pushed_to: Vec<Vec<Vec<usize>>>,
}

impl Lowering {
    fn new(ranks: usize, chunks: usize, multicast: bool) -> Self {
        let programs = (0..ranks)
            .map(|_| RankProgram {
                steps: vec![Step::CopyIn],
                values: (0..chunks)
                    .map(|chunk| Value {
                        chunk,
                        offset: None,
                    })
                    .collect(),
                arena_bytes: 0,
            })
            .collect();
        let held = (0..ranks)
            .map(|rank| {
                (0..chunks)
                    .map(|chunk| {
                        Some(Held {
                            value: ValueRef { rank, id: chunk },
                            set: Contributions::single(ranks, rank),
                            lowest: rank,
                        })
                    })
                    .collect()
            })
            .collect();
        Lowering {
            ranks,
            chunks,
            programs,
            held,
            reads: vec![vec![true; chunks]; ranks],
            sends: vec![0; ranks],
            output_written: vec![vec![false; chunks]; ranks],
            multicast,
            pushed_to: vec![vec![Vec::new(); chunks]; ranks],
        }
    }

    fn new_value(&mut self, rank: usize, chunk: usize) -> usize {
        self.programs[rank].values.push(Value {
            chunk,
            offset: None,
        });
        self.reads[rank].push(false);
        self.pushed_to[rank].push(Vec::new());
        self.programs[rank].values.len() - 1
    }

    fn mark_read(&mut self, value: ValueRef) {
        self.reads[value.rank][value.id] = true;
    }

    /// Emits the step that makes `rank` hold `what` for `chunk`.
    fn produce(&mut self, rank: usize, chunk: usize, what: Produced) {
        for &s in &what.sources {
            self.mark_read(s);
        }
        let out = self.new_value(rank, chunk);
        let complete = what.set.len() == self.ranks;
        let step = if what.copy {
            Step::Copy {
                chunk,
                source: what.sources[0],
                out,
                turn: what.turn,
            }
        } else {
            Step::Combine {
                chunk,
                sources: what.sources,
                out,
                complete,
                turn: what.turn,
            }
        };
        if complete {
            self.output_written[rank][chunk] = true;
        }
        self.programs[rank].steps.push(step);
        self.held[rank][chunk] = Some(Held {
            value: ValueRef { rank, id: out },
            set: what.set,
            lowest: what.lowest,
        });
    }

    fn holding(&self, rank: usize, chunk: usize) -> Result<Held, LowerError> {
        self.held[rank][chunk]
            .clone()
            .ok_or(LowerError::ReadsUnmaterialised { rank, chunk })
    }

    /// The direct-pull ReduceScatter: owners found by replaying the phase's contribution sets.
    fn reduce_scatter(
        &mut self,
        schedule: &Schedule,
        rounds: &[Vec<crate::schedule::Transfer>],
    ) -> Result<(), LowerError> {
        let early: Vec<usize> = (0..self.ranks)
            .filter(|&r| Some(r) != schedule.straggler)
            .collect();
        let mut sets: Vec<Vec<Contributions>> = (0..self.ranks)
            .map(|r| {
                (0..schedule.chunks)
                    .map(|_| Contributions::single(self.ranks, r))
                    .collect()
            })
            .collect();
        for round in rounds {
            let before = sets.clone();
            for t in round {
                sets[t.dst][t.chunk].union_with(&before[t.src][t.chunk]);
            }
        }
        let owners = (0..schedule.chunks)
            .map(|chunk| {
                early
                    .iter()
                    .copied()
                    .find(|&r| sets[r][chunk].len() == early.len())
                    .ok_or(LowerError::NoOwner { chunk })
            })
            .collect::<Result<Vec<usize>, LowerError>>()?;
        for (chunk, owner) in owners.into_iter().enumerate() {
            let mut set = Contributions::empty(self.ranks);
            for &r in &early {
                set.union_with(&Contributions::single(self.ranks, r));
            }
            for &r in &early {
                if r != owner {
                    self.held[r][chunk] = None;
                }
            }
            if early.len() == 1 {
                continue;
            }
            let sources = early
                .iter()
                .map(|&r| ValueRef { rank: r, id: chunk })
                .collect();
            let what = Produced {
                sources,
                set,
                lowest: early[0],
                copy: false,
                turn: None,
            };
            self.produce(owner, chunk, what);
        }
        Ok(())
    }

    /// In a multicast schedule, where `rank` still holds `chunk` as its `IN` chunk (the gather
    /// at two ranks, where the ReduceScatter of one early rank makes nothing), a local copy of it
    /// becomes the value held: `IN` lies at the chunk's own place in every arena, where a push
    /// cannot land, so a pushed value is always one a step makes.
    fn materialise_input(&mut self, rank: usize, chunk: usize) -> Result<(), LowerError> {
        let held = self.holding(rank, chunk)?;
        if held.value.rank == rank && held.value.id < self.chunks {
            let what = Produced {
                sources: vec![held.value],
                set: held.set,
                lowest: held.lowest,
                copy: false,
                turn: None,
            };
            self.produce(rank, chunk, what);
        }
        Ok(())
    }

    /// One round of a transfer-by-transfer phase; reads see values as of the round's start. In
    /// a multicast schedule every source is pushed into its destinations.
    fn round(&mut self, round: &[crate::schedule::Transfer]) -> Result<(), LowerError> {
        if self.multicast {
            for t in round {
                self.materialise_input(t.src, t.chunk)?;
            }
        }
        let reads: Vec<Held> = round
            .iter()
            .map(|t| self.holding(t.src, t.chunk))
            .collect::<Result<_, _>>()?;
        if self.multicast {
            for (t, src) in round.iter().zip(&reads) {
                self.pushed_to[src.value.rank][src.value.id].push(t.dst);
            }
        }
        for (t, src) in round.iter().zip(reads) {
            let turn = (!self.multicast).then(|| {
                self.sends[t.src] += 1;
                self.sends[t.src] - 1
            });
            match t.op {
                crate::schedule::Op::Copy => {
                    let what = Produced {
                        sources: vec![src.value],
                        set: src.set,
                        lowest: src.lowest,
                        copy: true,
                        turn,
                    };
                    self.produce(t.dst, t.chunk, what)
                }
                crate::schedule::Op::Reduce => {
                    let dst = self.holding(t.dst, t.chunk)?;
                    if dst.set.intersects(&src.set) {
                        return Err(LowerError::DoubleCount {
                            rank: t.dst,
                            chunk: t.chunk,
                        });
                    }
                    let (first, second) = if dst.lowest <= src.lowest {
                        (dst, src)
                    } else {
                        (src, dst)
                    };
                    let mut set = first.set.clone();
                    set.union_with(&second.set);
                    let lowest = first.lowest;
                    let what = Produced {
                        sources: vec![first.value, second.value],
                        set,
                        lowest,
                        copy: false,
                        turn,
                    };
                    self.produce(t.dst, t.chunk, what);
                }
            }
        }
        Ok(())
    }

    /// Checks that every rank ends with every chunk complete; what is left is the lowering
    /// without its arena layout.
    fn finish(self, schedule: &Schedule) -> Result<Lowered, LowerError> {
        for rank in 0..self.ranks {
            if let Some(chunk) = self.output_written[rank]
                .iter()
                .position(|written| !written)
            {
                return Err(LowerError::Incomplete { rank, chunk });
            }
        }
        check_reads(&self.programs, self.chunks, &self.pushed_to)?;
        // DefaultHasher::new() uses fixed keys: the same value in every process.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (&self.programs, &self.reads, self.multicast).hash(&mut hasher);
        let pushed: Vec<Vec<bool>> = self
            .pushed_to
            .iter()
            .map(|values| values.iter().map(|to| !to.is_empty()).collect())
            .collect();
        let slots = assign_slots(self.chunks, &self.reads, &self.pushed_to);
        let delivery = self.multicast.then_some(Delivery {
            pushed_to: self.pushed_to,
        });
        let mut lowered = Lowered {
            ranks: self.ranks,
            straggler: schedule.straggler,
            chunks: self.chunks,
            programs: self.programs,
            slots,
            pushed,
            delivery,
            structure: hasher.finish(),
            id: 0,
            need: ArenaNeed::default(),
        };
        // Both are read at every GPU call: computed once here.
        lowered.id = lowered.compute_id();
        lowered.need = lowered.compute_need(self.sends.iter().copied().max().unwrap_or(0));
        Ok(lowered)
    }
}

/// Checks what the GPU kernel relies on when it reads: every rank reads its own `IN` chunk `c`
/// only before it writes its output chunk `c` (a complete combine or a copy of chunk `c`), and
/// no rank reads a value it pushes (`pushed_to[rank][value]` non-empty).
pub(super) fn check_reads(
    programs: &[RankProgram],
    chunks: usize,
    pushed_to: &[Vec<Vec<usize>>],
) -> Result<(), LowerError> {
    for (rank, program) in programs.iter().enumerate() {
        let mut written = vec![false; chunks];
        for step in &program.steps {
            for source in step.reads().0.iter().filter(|s| s.rank == rank) {
                let chunk = program.values[source.id].chunk;
                if source.id < chunks && written[source.id] {
                    return Err(LowerError::ReadsInputAfterOutput { rank, chunk });
                }
                if !pushed_to[rank][source.id].is_empty() {
                    return Err(LowerError::ReadsOwnPushedValue { rank, chunk });
                }
            }
            match step {
                Step::Combine {
                    chunk,
                    complete: true,
                    ..
                }
                | Step::Copy { chunk, .. } => written[*chunk] = true,
                _ => {}
            }
        }
    }
    Ok(())
}

/// A schedule lowered to per-rank programs, for any count: the steps and values, without the
/// arena offsets (the only part that depends on the count). Lowering is the costly part of a
/// plan (it replays the schedule's contribution sets); a new count only lays out the arenas.
///
/// Arena layout, for `count` elements: `IN` first (value `c` at chunk `c`'s place in the
/// caller's buffer), then one slot of [`slot_bytes`] per produced value that a later step reads,
/// in value order; then, in a multicast plan, the slots of the pushed values, one per value of
/// any rank, the same slot in every rank's arena (a value pushed into its readers lands where
/// its owner keeps it, so one multicast store, which writes the same offset of every member,
/// reaches them all). A value's slot index does not depend on the count, so the device blobs
/// ([`Lowered::blob`]) serve every count and type.
#[derive(Debug, Clone)]
pub struct Lowered {
    ranks: usize,
    straggler: Option<usize>,
    /// Chunks of the schedule; values `0..chunks` of every rank are its `IN` chunks.
    chunks: usize,
    /// The programs, every `Value::offset` still `None`.
    programs: Vec<RankProgram>,
    /// `slots[rank][value]`: see [`Lowered::slots`].
    slots: Vec<Vec<Option<usize>>>,
    /// `pushed[rank][value]`: the value is written into its readers' arenas as it is made.
    pushed: Vec<Vec<bool>>,
    /// For a multicast schedule, see [`Plan::delivery`].
    delivery: Option<Delivery>,
    /// A hash of the programs and reads, for the plans' fingerprints.
    structure: u64,
    /// See [`Lowered::id`] and [`Lowered::need`].
    id: u64,
    need: ArenaNeed,
}

/// What a lowered schedule needs of a rank's staging, for any count (see
/// [`ArenaNeed::arena_bytes`]): the same numbers on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaNeed {
    /// Chunks of the schedule.
    pub chunks: usize,
    /// The most arena slots (kept produced values) any rank has.
    pub slots: usize,
    /// Values of all ranks together: a rank's flags (per parity and block) are an inbox with
    /// one word per value of any rank, written by the value's owner.
    pub values: usize,
    /// The most ordered sends of any rank in a call (the kernel counts them in 16 bits).
    pub sends: usize,
}

impl ArenaNeed {
    /// Arena bytes the rank with the most slots needs for `count` elements of `dtype`: `IN`,
    /// then its slots (a multiple of 16; non-decreasing in `count`).
    pub fn arena_bytes(&self, count: usize, dtype: DataType) -> usize {
        let size = dtype.size();
        align_up(count * size) + self.slots * slot_bytes(count, size, self.chunks.max(1))
    }
}

impl Lowered {
    /// Ranks of the schedule.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The straggler, if the algorithm has one.
    pub fn straggler(&self) -> Option<usize> {
        self.straggler
    }

    /// Identifies these programs (and so their blobs) in every process running this binary.
    pub fn id(&self) -> u64 {
        self.id
    }

    fn compute_id(&self) -> u64 {
        // DefaultHasher::new() uses fixed keys: the same value in every process.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (self.ranks, self.straggler, self.chunks, self.structure).hash(&mut hasher);
        hasher.finish()
    }

    /// The arena slot of each of `rank`'s values: `None` for the `IN` chunks and for values
    /// nobody reads, otherwise its index among the arena's slots (see the type's doc).
    fn slots(&self, rank: usize) -> impl Iterator<Item = Option<usize>> + '_ {
        self.slots[rank].iter().copied()
    }

    /// Slots every rank's arena spans: its own kept values', and in a multicast plan every
    /// pushed value's (which may land in it).
    fn arena_slots(&self, rank: usize) -> usize {
        if self.delivery.is_some() {
            return self.need.slots;
        }
        self.slots(rank).flatten().max().map_or(0, |k| k + 1)
    }

    /// What these programs need of the staging, for any count.
    pub fn need(&self) -> ArenaNeed {
        self.need
    }

    /// [`Lowered::need`], from the programs and the most sends of any rank.
    fn compute_need(&self, max_sends: usize) -> ArenaNeed {
        ArenaNeed {
            chunks: self.chunks,
            slots: self
                .slots
                .iter()
                .flatten()
                .flatten()
                .max()
                .map_or(0, |k| k + 1),
            values: self.programs.iter().map(|p| p.values.len()).sum(),
            sends: max_sends,
        }
    }

    /// The plan for `count` elements of `dtype`, laid out as the type's doc says.
    pub fn plan(&self, count: usize, dtype: DataType) -> Plan {
        let size = dtype.size();
        let chunks = chunk_ranges(count, size, self.chunks);
        let in_bytes = align_up(count * size);
        let slot = slot_bytes(count, size, self.chunks);
        let mut programs = self.programs.clone();
        for (rank, program) in programs.iter_mut().enumerate() {
            for ((id, value), kept) in program.values.iter_mut().enumerate().zip(self.slots(rank)) {
                if id < self.chunks {
                    value.offset = Some(chunks[value.chunk].start * size);
                } else if let Some(k) = kept {
                    value.offset = Some(in_bytes + k * slot);
                }
            }
            program.arena_bytes = in_bytes + self.arena_slots(rank) * slot;
        }
        // The offsets follow from the structure and the chunks: hashing those identifies the
        // plan. DefaultHasher::new() uses fixed keys: the same value in every process.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (
            self.ranks,
            self.straggler,
            count,
            dtype,
            &chunks,
            self.structure,
        )
            .hash(&mut hasher);
        Plan {
            ranks: self.ranks,
            straggler: self.straggler,
            count,
            dtype,
            chunks,
            programs,
            delivery: self.delivery.clone(),
            fingerprint: hasher.finish(),
        }
    }

    /// `rank`'s device blob: its steps, and every rank's values with their slots (for any
    /// count and type; the launch says which).
    pub fn blob(&self, rank: usize) -> PlanBlob {
        encode_programs(self.chunks, &self.programs, &self.slots, &self.pushed, rank)
    }
}

/// `slots[rank][value]` (see [`Lowered`]'s arena layout): each rank's kept values that are not
/// pushed numbered from 0 in value order; then every value pushed to one reader, then every
/// value pushed to several (each group rank by rank, in value order), numbered after the most
/// slots of the first kind any rank has, so a pushed value's slot is free in every arena it may
/// land in, and the values a multicast store carries have the last slots, one after another.
fn assign_slots(
    chunks: usize,
    reads: &[Vec<bool>],
    pushed_to: &[Vec<Vec<usize>>],
) -> Vec<Vec<Option<usize>>> {
    let kept = |rank: usize, id: usize| id >= chunks && reads[rank][id];
    let pushed = |rank: usize, id: usize| !pushed_to[rank][id].is_empty();
    let own_most = (0..reads.len())
        .map(|rank| {
            (0..reads[rank].len())
                .filter(|&id| kept(rank, id) && !pushed(rank, id))
                .count()
        })
        .max()
        .unwrap_or(0);
    let mut slots: Vec<Vec<Option<usize>>> = reads
        .iter()
        .enumerate()
        .map(|(rank, values)| {
            let mut next_own = 0;
            (0..values.len())
                .map(|id| {
                    (kept(rank, id) && !pushed(rank, id)).then(|| {
                        next_own += 1;
                        next_own - 1
                    })
                })
                .collect()
        })
        .collect();
    let mut next = own_most;
    for several in [false, true] {
        for (rank, values) in pushed_to.iter().enumerate() {
            for (id, to) in values.iter().enumerate() {
                if kept(rank, id) && !to.is_empty() && (to.len() > 1) == several {
                    slots[rank][id] = Some(next);
                    next += 1;
                }
            }
        }
    }
    slots
}

/// Lowers a verified `schedule` to programs for any count (see [`Lowered::plan`]).
pub fn lower_structure(schedule: &Schedule) -> Result<Lowered, LowerError> {
    let mut lowering = Lowering::new(schedule.ranks, schedule.chunks, schedule.multicast);
    for phase in &schedule.phases {
        if phase.kind == PhaseKind::ReduceScatter {
            lowering.reduce_scatter(schedule, &phase.rounds)?;
        } else {
            for round in &phase.rounds {
                lowering.round(round)?;
            }
        }
    }
    lowering.finish(schedule)
}

/// Lowers a verified `schedule` for `count` elements of `dtype`.
pub fn lower(schedule: &Schedule, count: usize, dtype: DataType) -> Result<Plan, LowerError> {
    Ok(lower_structure(schedule)?.plan(count, dtype))
}
