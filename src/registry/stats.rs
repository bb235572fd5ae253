//! A communicator's AllReduce counters (kept in its record, `super::comms`): how many calls, how
//! many ran on StragglAR and on NCCL, and why each fallback happened. Lock-free; a new
//! communicator at a reused address gets a new record, so it starts from zero.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::registry::fallback::Fallback;

/// The counters of one communicator.
#[derive(Default)]
pub struct CommStats {
    calls: AtomicU64,
    on_stragglar: AtomicU64,
    fallbacks: [AtomicU64; Fallback::ALL.len()],
    /// Whether each cause was already logged for this communicator.
    logged: [AtomicBool; Fallback::ALL.len()],
    /// When the last periodic report was due (ns on the monotonic clock; 0 before the first
    /// call).
    last_report_ns: AtomicU64,
}

/// A copy of one communicator's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    pub calls: u64,
    pub on_stragglar: u64,
    /// Calls forwarded to NCCL, by [`Fallback::index`].
    pub fallbacks: [u64; Fallback::ALL.len()],
}

impl StatsSnapshot {
    /// Calls forwarded to NCCL, whatever the cause.
    pub fn on_nccl(&self) -> u64 {
        self.fallbacks.iter().sum()
    }
}

impl CommStats {
    /// Counts a call that ran on StragglAR.
    pub fn ran_stragglar(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.on_stragglar.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a call forwarded for `cause`; true the first time this cause is seen here.
    pub fn fell_back(&self, cause: Fallback) -> bool {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.fallbacks[cause.index()].fetch_add(1, Ordering::Relaxed);
        !self.logged[cause.index()].swap(true, Ordering::Relaxed)
    }

    /// Whether a periodic report is due at `now_ns` (every `interval_ns`, counted from the
    /// first call); true for exactly one caller per period.
    pub fn report_due(&self, now_ns: u64, interval_ns: u64) -> bool {
        let last = self.last_report_ns.load(Ordering::Relaxed);
        if last == 0 {
            let _ = self.last_report_ns.compare_exchange(
                0,
                now_ns.max(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return false;
        }
        interval_ns > 0
            && now_ns.saturating_sub(last) >= interval_ns
            && self
                .last_report_ns
                .compare_exchange(last, now_ns, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            calls: self.calls.load(Ordering::Relaxed),
            on_stragglar: self.on_stragglar.load(Ordering::Relaxed),
            fallbacks: std::array::from_fn(|i| self.fallbacks[i].load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_first_sightings() {
        let s = CommStats::default();
        assert!(s.fell_back(Fallback::TooFewRanks));
        assert!(!s.fell_back(Fallback::TooFewRanks));
        assert!(s.fell_back(Fallback::InGroup));
        s.ran_stragglar();
        let snap = s.snapshot();
        assert_eq!(snap.calls, 4);
        assert_eq!(snap.on_stragglar, 1);
        assert_eq!(snap.on_nccl(), 3);
        assert_eq!(snap.fallbacks[Fallback::TooFewRanks.index()], 2);
        assert!(
            !s.report_due(1_000, 500),
            "the first call starts the period"
        );
        assert!(!s.report_due(1_400, 500));
        assert!(s.report_due(1_600, 500));
        assert!(!s.report_due(1_700, 500), "once per period");
        assert!(!s.report_due(9_000, 0), "interval 0: never");
        assert_eq!(CommStats::default().snapshot(), StatsSnapshot::default());
    }
}
