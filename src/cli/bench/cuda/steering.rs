//! How each call of `stragglar bench --backend cuda` picks its plan: the one `--algo` fixes, or
//! (`--algo auto`) the library's own policy, each rank deciding from the arrival records its
//! ring holds, `RECORD_LAG` calls late, exactly as `ncclAllReduce` does; the baseline is Ring
//! on our kernel (NCCL cannot run two ranks on one GPU).

use super::Setup;
use crate::detect::{Choice, Policy, Tracker};
use crate::engine::cuda::library::{NVSWITCH_LINK, RECORD_LAG};
use crate::engine::cuda::rank::{CallError, CudaRank, GraphCounts};
use crate::gpu::choice::RawRule;
use crate::plan::Plan;
use crate::reduce::DataType;
use crate::schedule::Algorithm;

/// The plans one size may run.
pub enum Plans {
    /// `--algo stragglar|ring`: one plan.
    Fixed(Plan),
    /// `--algo auto`: StragglAR with each rank as the straggler, and Ring.
    Auto { stragglar: Vec<Plan>, ring: Plan },
}

impl Plans {
    /// The plans of `bytes` of `dtype`.
    pub fn for_size(setup: &mut Setup, dtype: DataType, bytes: u64) -> Result<Plans, String> {
        if !setup.auto {
            return setup.plan(dtype, bytes).map(Plans::Fixed);
        }
        let stragglar = (0..setup.ranks)
            .map(|s| setup.plan_of(Algorithm::Stragglar, s, dtype, bytes))
            .collect::<Result<_, _>>()?;
        let ring = setup.plan_of(Algorithm::Ring, 0, dtype, bytes)?;
        Ok(Plans::Auto { stragglar, ring })
    }

    /// The plan every rank checks the size against (the same elements whatever the choice).
    pub fn reference(&self) -> &Plan {
        match self {
            Plans::Fixed(plan) => plan,
            Plans::Auto { ring, .. } => ring,
        }
    }

    /// Every plan a call of this size may run.
    pub fn all(&self) -> Vec<&Plan> {
        match self {
            Plans::Fixed(plan) => vec![plan],
            Plans::Auto { stragglar, ring } => stragglar.iter().chain([ring]).collect(),
        }
    }

    fn of(&self, choice: Choice) -> &Plan {
        match (self, choice) {
            (Plans::Fixed(plan), _) => plan,
            (Plans::Auto { stragglar, .. }, Choice::Stragglar { straggler }) => {
                &stragglar[straggler]
            }
            (Plans::Auto { ring, .. }, Choice::Baseline) => ring,
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
    ) -> Result<&'p Plan, CallError> {
        self.calls += 1;
        self.size_calls += 1;
        let choice = match &mut self.tracker {
            None => match plans.reference().straggler {
                Some(straggler) => Choice::Stragglar { straggler },
                None => Choice::Baseline,
            },
            Some(tracker) => {
                let designated = &mut self.designated;
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
