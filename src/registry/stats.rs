//! Per-communicator AllReduce counters: how many calls, how many ran on StragglAR and on NCCL,
//! and why each fallback happened. Lock-free once a communicator's entry exists; a new
//! communicator at a reused address starts from zero.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::nccl::types::ncclComm_t;
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

/// Counters by communicator handle.
#[derive(Default)]
pub struct StatsTable {
    entries: RwLock<HashMap<usize, Arc<CommStats>>>,
}

impl StatsTable {
    /// The counters of `comm`, made on first use.
    pub fn of(&self, comm: ncclComm_t) -> Arc<CommStats> {
        if let Some(s) = self.entries.read().get(&(comm as usize)) {
            return s.clone();
        }
        self.entries
            .write()
            .entry(comm as usize)
            .or_default()
            .clone()
    }

    /// The counters of `comm`, if it has any.
    pub fn get(&self, comm: ncclComm_t) -> Option<StatsSnapshot> {
        self.entries
            .read()
            .get(&(comm as usize))
            .map(|s| s.snapshot())
    }

    /// Forgets `comm` (destroyed, or a new communicator at its address) and returns its last
    /// counters.
    pub fn remove(&self, comm: ncclComm_t) -> Option<StatsSnapshot> {
        self.entries
            .write()
            .remove(&(comm as usize))
            .map(|s| s.snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_first_sightings() {
        let table = StatsTable::default();
        let comm = 0x40 as ncclComm_t;
        let s = table.of(comm);
        assert!(s.fell_back(Fallback::TooFewRanks));
        assert!(!s.fell_back(Fallback::TooFewRanks));
        assert!(s.fell_back(Fallback::InGroup));
        s.ran_stragglar();
        let snap = table.get(comm).unwrap();
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
        assert_eq!(table.remove(comm), Some(snap));
        assert_eq!(table.get(comm), None);
        assert_eq!(table.of(comm).snapshot(), StatsSnapshot::default());
    }
}
