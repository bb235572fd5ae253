//! How each call of `stragglar bench --backend cuda` picks its plan: the one `--algo` fixes, or
//! (`--algo auto`) the library's own policy, each rank deciding from the arrival records its
//! ring holds, `RECORD_LAG` calls late, exactly as `ncclAllReduce` does; the baseline is Ring
//! on our kernel (NCCL cannot run two ranks on one GPU).

use super::Setup;
use crate::detect::{Choice, Policy, Tracker};
use crate::engine::cuda::library::{NVSWITCH_LINK, RECORD_LAG};
use crate::engine::cuda::rank::{CallError, CudaRank, GraphCounts};
use crate::gpu::choice::RawRule;
use crate::plan::Lowered;
use crate::reduce::DataType;
use crate::schedule::Algorithm;

/// The plans one size may run: schedules lowered for any count, run on `count` elements of
/// `dtype`.
pub struct Plans {
    pub count: usize,
    pub dtype: DataType,
    choices: Choices,
}

enum Choices {
    /// `--algo stragglar|ring`: one plan.
    Fixed(Lowered),
    /// `--algo auto`: StragglAR with each rank as the straggler, and Ring.
    Auto {
        stragglar: Vec<Lowered>,
        ring: Lowered,
    },
}

impl Plans {
    /// The plans of `bytes` (whole elements) of `dtype`.
    pub fn for_size(setup: &mut Setup, dtype: DataType, bytes: u64) -> Result<Plans, String> {
        let choices = if setup.auto {
            let stragglar = (0..setup.ranks)
                .map(|s| setup.lowered_of(Algorithm::Stragglar, s))
                .collect::<Result<_, _>>()?;
            let ring = setup.lowered_of(Algorithm::Ring, 0)?;
            Choices::Auto { stragglar, ring }
        } else {
            Choices::Fixed(setup.lowered_of(setup.algorithm, setup.straggler)?)
        };
        Ok(Plans {
            count: bytes as usize / dtype.size(),
            dtype,
            choices,
        })
    }

    /// Every plan a call of this size may run (with `--algo auto`: StragglAR with each
    /// straggler, then Ring, as `CudaRank::prepare_choices` takes them).
    pub fn all(&self) -> Vec<&Lowered> {
        match &self.choices {
            Choices::Fixed(plan) => vec![plan],
            Choices::Auto { stragglar, ring } => stragglar.iter().chain([ring]).collect(),
        }
    }

    fn of(&self, choice: Choice) -> &Lowered {
        match (&self.choices, choice) {
            (Choices::Fixed(plan), _) => plan,
            (Choices::Auto { stragglar, .. }, Choice::Stragglar { straggler }) => {
                &stragglar[straggler]
            }
            (Choices::Auto { ring, .. }, Choice::Baseline) => ring,
        }
    }

    /// What a call of the fixed plan counts as (`--algo stragglar|ring`).
    fn fixed_choice(&self) -> Choice {
        match &self.choices {
            Choices::Fixed(plan) => match plan.straggler() {
                Some(straggler) => Choice::Stragglar { straggler },
                None => Choice::Baseline,
            },
            Choices::Auto { .. } => Choice::Baseline,
        }
    }
}

/// One rank's choices: its tracker (with `--algo auto`) and what it chose during a size.
pub struct Steering {
    tracker: Option<Tracker>,
    /// Ticketed calls so far (the late rank of each follows `--late-rank`/`--late-every`).
    pub calls: u64,
    /// During the current size: calls on StragglAR, calls made, a digest of every choice (the
    /// same on every rank, or the policy is broken).
    pub stragglar_calls: u64,
    pub size_calls: u64,
    pub choices: u64,
    /// The designation of the last fed record's size class.
    pub designated: Option<usize>,
    /// Time spent waiting for arrival records the GPU had not written yet (GPU progress, not
    /// host cost).
    pub record_waits: std::time::Duration,
}

impl Steering {
    /// `auto`: the policy of `ranks` ranks under `STRAGGLAR_ALGO`/`STRAGGLAR_STRAGGLER`.
    pub fn new(ranks: usize, auto: bool) -> Steering {
        let config = crate::config::get();
        Steering {
            tracker: auto.then(|| {
                let policy = Policy::new(ranks, config.algo, config.straggler, NVSWITCH_LINK);
                Tracker::new(policy, ranks, RECORD_LAG)
            }),
            calls: 0,
            stragglar_calls: 0,
            size_calls: 0,
            choices: 0,
            designated: None,
            record_waits: std::time::Duration::ZERO,
        }
    }

    /// The rule graph launches of `bytes` choose by on the GPU (`--algo auto` only).
    pub fn rule(&self, bytes: usize) -> Option<RawRule> {
        self.tracker
            .as_ref()
            .map(|t| RawRule::new(t.policy(), bytes))
    }

    /// Counts graph replays whose choices the GPU made (`counts` since the size started): the
    /// same columns as eager calls.
    pub fn count_replays(&mut self, counts: GraphCounts) {
        let replays = counts.stragglar + counts.baseline;
        self.size_calls += replays;
        self.stragglar_calls += counts.stragglar;
        self.choices = crate::cli::bench::data::digest_more(self.choices, counts.stragglar);
        self.choices = crate::cli::bench::data::digest_more(self.choices, replays);
        if replays > 0 {
            self.designated = counts.last_straggler;
        }
    }

    /// Starts a size's counters.
    pub fn start_size(&mut self) {
        (self.stragglar_calls, self.size_calls, self.choices) = (0, 0, 0);
    }

    /// The plan of the next eager (ticketed) call of `bytes`: due records are read from
    /// `comm`'s ring first (waiting for them), as the library does.
    pub fn next<'p>(
        &mut self,
        comm: &CudaRank,
        plans: &'p Plans,
        bytes: usize,
    ) -> Result<&'p Lowered, CallError> {
        self.calls += 1;
        self.size_calls += 1;
        let choice = match &mut self.tracker {
            None => plans.fixed_choice(),
            Some(tracker) => {
                let designated = &mut self.designated;
                self.record_waits +=
                    comm.feed_due(tracker, |_, observed| *designated = observed.designated)?;
                tracker.decide(bytes)
            }
        };
        let code = choice.straggler().map_or(u64::MAX, |s| s as u64);
        self.choices = crate::cli::bench::data::digest_more(self.choices, code);
        self.stragglar_calls += u64::from(code != u64::MAX);
        Ok(plans.of(choice))
    }
}
