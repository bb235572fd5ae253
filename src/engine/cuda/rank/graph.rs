//! A rank's graph launches: the plans a replay chooses among, uploaded once with their tables,
//! the launch whose replays choose on the GPU, and what they chose.

use super::{CallError, CudaRank};
use crate::detect::Finish;
use crate::engine::cuda::args::Operands;
use crate::engine::cuda::branch::{Branch, BranchError, Hoisted, NcclWork, OurKernels};
use crate::engine::cuda::driver::{DeviceMemory, GpuError};
use crate::gpu::choice::{
    RawClassState, RawClassTimes, RawGraphState, RawRule, RawSamples, SIZE_CLASSES,
};
use crate::plan::{ArenaNeed, Lowered};
use crate::reduce::DataType;

/// The plans graph launches choose among, for every size, in one allocation: the blobs, then
/// three tables of `u64[ranks + 1]` blob addresses, StragglAR with straggler `s` at `s` and the
/// baseline last: Ring in one, StragglAR with the last rank as the straggler in another (for
/// sizes where Ring does not fit the staging), and none (0: NCCL's captured work) in the third.
pub(super) struct ChoiceTables {
    /// Keeps the blobs and tables alive.
    _memory: DeviceMemory,
    /// Device addresses of the three tables.
    ring_last: u64,
    straggler_last: u64,
    nccl_last: u64,
    /// What each StragglAR plan and Ring need of the staging.
    stragglar: Vec<ArenaNeed>,
    ring: ArenaNeed,
}

/// What a rank's graph launches chose, counted on its GPU (the same on every rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphCounts {
    /// Graph calls on StragglAR and on the Ring baseline.
    pub stragglar: u64,
    pub baseline: u64,
    /// The straggler of the latest graph call, `None` when it ran Ring (or none ran).
    pub last_straggler: Option<usize>,
}

impl CudaRank {
    /// Whether graph launches can be captured: the plans they choose among are uploaded.
    pub fn has_choices(&self) -> bool {
        !self.choices.is_empty()
    }

    /// Uploads every plan a graph launch whose StragglAR plans are finished by `finish` may
    /// pick, for every size, and their tables: `plans[s]` is StragglAR with straggler `s`,
    /// `plans[ranks]` Ring. One allocation and one copy for the whole set; once per rank and
    /// `finish` (later calls do nothing). Not during graph capture.
    pub fn prepare_choices(&mut self, plans: &[&Lowered], finish: Finish) -> Result<(), CallError> {
        if self.choices.iter().any(|(f, _)| *f == finish) {
            return Ok(());
        }
        let ranks = self.config.ranks;
        let in_order = plans.len() == ranks + 1
            && plans.iter().enumerate().all(|(choice, p)| {
                p.ranks() == ranks && (choice == ranks || p.straggler() == Some(choice))
            });
        if !in_order {
            return Err(CallError::Unfit(format!(
                "a graph launch chooses among {} plans: StragglAR with each straggler, then Ring",
                ranks + 1
            )));
        }
        // Every blob at a 256-byte boundary, then the two tables of their addresses.
        let blobs: Vec<Vec<u8>> = plans
            .iter()
            .map(|p| p.blob(self.config.rank).bytes)
            .collect();
        let mut offsets = Vec::with_capacity(blobs.len());
        let mut end = 0usize;
        for blob in &blobs {
            offsets.push(end);
            end = (end + blob.len()).div_ceil(256) * 256;
        }
        let ring_last = end;
        let straggler_last = ring_last + 8 * (ranks + 1);
        let nccl_last = straggler_last + 8 * (ranks + 1);
        // The NCCL table's entries are StragglAR's, then 0 (left as zeroed).
        let mut bytes = vec![0u8; nccl_last + 8 * (ranks + 1)];
        let memory = DeviceMemory::for_upload(&self.device, bytes.len())?;
        let address = |choice: usize| memory.ptr + offsets[choice] as u64;
        for (choice, (blob, &at)) in blobs.iter().zip(&offsets).enumerate() {
            bytes[at..at + blob.len()].copy_from_slice(blob);
            let entry = ring_last + 8 * choice;
            bytes[entry..entry + 8].copy_from_slice(&address(choice).to_le_bytes());
            let baseline = if choice == ranks { ranks - 1 } else { choice };
            let entry = straggler_last + 8 * choice;
            bytes[entry..entry + 8].copy_from_slice(&address(baseline).to_le_bytes());
            if choice < ranks {
                let entry = nccl_last + 8 * choice;
                bytes[entry..entry + 8].copy_from_slice(&address(choice).to_le_bytes());
            }
        }
        memory.upload(&bytes)?;
        // Eager calls of these plans use the same blobs (no second upload).
        for (choice, plan) in plans.iter().enumerate() {
            self.plans.entry(plan.id()).or_insert(address(choice));
        }
        let stragglar = plans[..ranks].iter().map(|p| p.need()).collect();
        self.choices.push((
            finish,
            ChoiceTables {
                ring_last: memory.ptr + ring_last as u64,
                straggler_last: memory.ptr + straggler_last as u64,
                nccl_last: memory.ptr + nccl_last as u64,
                _memory: memory,
                stragglar,
                ring: plans[ranks].need(),
            },
        ));
        Ok(())
    }

    /// `Ok` when every StragglAR plan finished by `finish` a graph launch may pick is uploaded
    /// and fits the staging at `count` elements of `dtype` (the same answer on every rank: the
    /// staging layout is agreed).
    pub fn choices_fit(
        &self,
        count: usize,
        dtype: DataType,
        finish: Finish,
    ) -> Result<(), CallError> {
        self.fitting_choices(count, dtype, finish).map(|_| ())
    }

    /// The uploaded choices of `finish`, when every StragglAR plan fits at `count` elements of
    /// `dtype`.
    fn fitting_choices(
        &self,
        count: usize,
        dtype: DataType,
        finish: Finish,
    ) -> Result<&ChoiceTables, CallError> {
        let Some((_, choices)) = self.choices.iter().find(|(f, _)| *f == finish) else {
            return Err(CallError::Unfit(format!(
                "the plans finished by {finish} must be prepared before graph capture (no allocation while capturing)"
            )));
        };
        for &need in &choices.stragglar {
            self.fits(need, count, dtype)?;
        }
        Ok(choices)
    }

    /// Queues one AllReduce captured into a graph: each replay numbers itself, records its
    /// arrival on the graph board, feeds the device detector of its size class and runs the
    /// plan `rule` picks from the records (see `crate::gpu::choice`), with no host involved:
    /// StragglAR finished by `finish`, or the baseline. `prepare_choices` must have uploaded the
    /// plans of `finish`. The baseline is Ring where it fits the
    /// staging at this size, StragglAR with the last rank as the straggler above (the staging
    /// is sized for StragglAR: Ring's single-assignment arena is 2.6 times the message at 8
    /// ranks, StragglAR's 1.7). A call without elements queues nothing (on every rank alike).
    ///
    /// # Safety
    /// As [`CudaRank::all_reduce`]: the operands hold `count` elements of this device for
    /// every replay; `stream` is a live stream of this device.
    pub unsafe fn all_reduce_graph(
        &mut self,
        operands: Operands,
        stream: cudarc::driver::sys::CUstream,
        rule: RawRule,
        finish: Finish,
    ) -> Result<(), CallError> {
        self.fail_fast()?;
        let (count, dtype) = (operands.count, operands.dtype);
        let choices = self.fitting_choices(count, dtype, finish)?;
        if count == 0 {
            return Ok(());
        }
        let table = if self.fits(choices.ring, count, dtype).is_ok() {
            choices.ring_last
        } else {
            choices.straggler_last
        };
        let args = self.site()?.graph(table, self.graph_board, rule, &operands);
        // SAFETY: every address in `args` is live device memory of this rank (staging with its
        // graph state, plan table and blobs, peer table, host words, rank 0's mapped graph
        // board) or the caller's buffers, which the caller vouches for.
        unsafe {
            self.kernels
                .all_reduce
                .launch(stream, self.config.blocks, self.config.threads, &args)
        }?;
        Ok(())
    }

    /// Whether graph replays can take NCCL's captured work as their baseline (every rank can
    /// put it behind a conditional node).
    pub fn has_branch(&self) -> bool {
        self.branch.is_some()
    }

    /// Gives this rank what puts NCCL's work behind a conditional node, or takes it away
    /// (alike on every rank: the setup's records decide).
    pub fn set_branch(&mut self, branch: Option<Branch>) {
        self.branch = branch;
    }

    /// Captures what `nccl` queues for this call apart (see `super::super::branch`): the work
    /// for [`CudaRank::all_reduce_graph_or_nccl`].
    ///
    /// # Safety
    /// `nccl` queues this call's NCCL work, of this device, on the stream it is given.
    pub unsafe fn capture_nccl_apart(
        &self,
        nccl: &dyn Fn(crate::nccl::types::cudaStream_t) -> crate::nccl::types::ResultCode,
    ) -> Result<NcclWork, BranchError> {
        let Some(branch) = &self.branch else {
            return Err(BranchError::Gpu(GpuError {
                call: "cuGraphConditionalHandleCreate",
                detail: "this rank has no conditional graph nodes".into(),
            }));
        };
        // SAFETY: as the caller vouches.
        unsafe { branch.capture_apart(&self.device, nccl) }
    }

    /// Queues a captured AllReduce whose replays choose, on the GPU as [`all_reduce_graph`]'s
    /// do, between StragglAR finished by `finish` and NCCL's own `work` for the call (behind a
    /// conditional node, with the event nodes `qualified` hoisted out of it around), when every
    /// rank can: each makes its IF nodes and bodies first and votes on them in its page
    /// (`super::super::failure`), for the communicator's graph capture number `capture`
    /// (numbered alike on every rank from 1). Where a rank cannot (its work does not qualify,
    /// `qualified` says why, or its driver refused the node), every rank adds its `work` as it
    /// is instead, and `Ok(Err(why))` says why: a rank whose graph held NCCL's work alone while
    /// its peers' held our kernel would hang them both.
    ///
    /// [`all_reduce_graph`]: CudaRank::all_reduce_graph
    ///
    /// # Safety
    /// As [`CudaRank::all_reduce_graph`]; `work` is this call's NCCL work.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce_graph_or_nccl(
        &self,
        operands: Operands,
        stream: cudarc::driver::sys::CUstream,
        rule: RawRule,
        finish: Finish,
        work: &NcclWork,
        qualified: &Result<Hoisted, String>,
        capture: u32,
    ) -> Result<Result<(), String>, CallError> {
        self.fail_fast()?;
        let (count, dtype) = (operands.count, operands.dtype);
        let table = self.fitting_choices(count, dtype, finish)?.nccl_last;
        let args = self.site()?.graph(table, self.graph_board, rule, &operands);
        let branch = self
            .branch
            .as_ref()
            .ok_or_else(|| CallError::Unfit("no conditional nodes here".into()))?;
        let (kernels, blocks, threads) = (&self.kernels, self.config.blocks, self.config.threads);
        // Each launch: every address in `args` is live memory of this rank or the caller's
        // buffers, as in `all_reduce_graph`; each stream given is one of this device.
        // SAFETY: as said above.
        let all_reduce = |s| unsafe { kernels.all_reduce.launch(s, blocks, threads, &args) };
        // SAFETY: as said above.
        let arrival = |s| unsafe { kernels.graph_arrival.launch(s, 1, 32, &args) };
        // SAFETY: as said above.
        let end = |s| unsafe { kernels.graph_end.launch(s, 1, 32, &args) };
        let ours = OurKernels {
            all_reduce: &all_reduce,
            arrival: &arrival,
            end: &end,
        };
        let made = match qualified {
            // SAFETY: the caller's capturing stream of this device; `ours` queue work of it.
            Ok(hoisted) => unsafe { branch.begin(&self.device, stream, work, hoisted, &ours) }?
                .map_err(|e| e.to_string()),
            Err(why) => Err(why.clone()),
        };
        self.failure_word().vote_capture(capture, made.is_ok());
        let deadline = self
            .timeout()
            .and_then(|t| std::time::Instant::now().checked_add(t));
        let votes = self.wait_for_every_rank(deadline, |word| word.capture_vote(capture))?;
        match (made, votes.iter().position(|&behind| !behind)) {
            (Ok(branches), None) => {
                let Ok(hoisted) = qualified else {
                    unreachable!("branches are made only for qualified work")
                };
                // SAFETY: the caller's capturing stream of this device, and the branches
                // `begin` made there; `args` as said above.
                unsafe { branch.complete(&self.device, stream, branches, hoisted, &args) }?;
                Ok(Ok(()))
            }
            (made, refused) => {
                let why = match (&made, refused) {
                    (Err(why), _) => why.clone(),
                    (Ok(_), r) => format!(
                        "rank {} cannot put its NCCL work behind a conditional node",
                        r.unwrap_or(self.config.rank)
                    ),
                };
                if let Ok(branches) = made {
                    // SAFETY: made by `begin` in this capture.
                    unsafe { branch.remove(&self.device, branches) }?;
                }
                // SAFETY: the caller's capturing stream.
                unsafe { branch.capture_plain(&self.device, stream, work) }?;
                if let Ok(hoisted) = qualified {
                    // SAFETY: as above.
                    unsafe { branch.record_all(stream, hoisted) }?;
                }
                Ok(Err(why))
            }
        }
    }

    /// What this rank's graph launches chose so far, as its GPU counted them; `None` when the
    /// device cannot be read. Synchronous: read once the replays are done (or at destroy).
    pub fn graph_counts(&self) -> Option<GraphCounts> {
        let base = self.config.layout.graph();
        let word = |offset: usize| self.staging.read_u32(base + offset as u64).map(u64::from);
        let counter = |offset: usize| Some(word(offset).ok()? | word(offset + 4).ok()? << 32);
        let last = word(std::mem::offset_of!(RawGraphState, last_choice)).ok()?;
        Some(GraphCounts {
            stragglar: counter(std::mem::offset_of!(RawGraphState, on_stragglar))?,
            baseline: counter(std::mem::offset_of!(RawGraphState, on_baseline))?,
            last_straggler: (1..=self.config.ranks as u64)
                .contains(&last)
                .then(|| last as usize - 1),
        })
    }

    /// Post-arrival times of the baseline the device's policy took so far, over every size
    /// class; `None` when the device cannot be read. Synchronous (a read per class), as
    /// [`CudaRank::graph_counts`].
    pub fn graph_baseline_timed(&self) -> Option<u64> {
        let base = self.config.layout.graph();
        let taken = std::mem::offset_of!(RawClassState, times)
            + std::mem::offset_of!(RawClassTimes, baseline)
            + std::mem::offset_of!(RawSamples, taken);
        let mut timed = 0;
        for class in 0..SIZE_CLASSES as usize {
            let at = base
                + (std::mem::offset_of!(RawGraphState, classes)
                    + class * std::mem::size_of::<RawClassState>()
                    + taken) as u64;
            let low = u64::from(self.staging.read_u32(at).ok()?);
            let high = u64::from(self.staging.read_u32(at + 4).ok()?);
            timed += low | high << 32;
        }
        Some(timed)
    }
}
