//! One record per communicator, keyed by the real `ncclComm_t` (returned to the caller
//! unchanged): its facts, counters, PreMulSum ops and the GPU engine's slot, made at init and
//! retired at destroy or abort as one.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use once_cell::sync::OnceCell;
use parking_lot::{Mutex, RwLock};

use super::redops::PreMulSum;
use super::stats::{CommStats, StatsSnapshot};
use crate::nccl::types::{ncclComm_t, RedOpCode};

/// Which call made a communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommOrigin {
    InitRank,
    InitRankConfig,
    InitAll,
    InitRankScalable,
    Split,
    Shrink,
    Grow,
}

/// Where a communicator is in its life, as far as the application's calls tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommState {
    /// Made, not yet finalized, revoked or destroyed.
    Live,
    /// `ncclCommFinalize` returned; only Destroy may follow.
    Finalized,
    /// `ncclCommRevoke` returned; in-flight work was stopped.
    Revoked,
    /// `ncclCommDestroy` or `ncclCommAbort` returned: the handle is dangling.
    Destroyed,
}

/// What we know about one communicator. Fields that NCCL had not settled when the init call
/// returned (a nonblocking init still in progress) are `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommInfo {
    /// Ranks in the communicator.
    pub nranks: Option<i32>,
    /// This process's rank in it.
    pub rank: Option<i32>,
    /// CUDA device ordinal it runs on.
    pub cuda_device: Option<i32>,
    /// Whether NCCL calls on it block (`ncclConfig_t::blocking`).
    pub blocking: bool,
    pub origin: CommOrigin,
    pub state: CommState,
    /// Every rank lives in this process (`ncclCommInitAll`, or split or shrunk from such a
    /// communicator): one thread may drive them all, so nothing may block on one rank's peers.
    pub single_process: bool,
}

/// The GPU engine's state of a communicator, opaque here (the engine keeps its own type in it).
pub type EngineSlot = Arc<dyn Any + Send + Sync>;

/// Everything kept about one communicator: its facts, its AllReduce counters, its PreMulSum
/// ops and the GPU engine's slot. Made when an init, split, shrink or grow returns it (or, for
/// a handle we did not see made, at its first counted call or created op), retired at destroy
/// or abort, replaced whole when a new communicator takes its address.
#[derive(Default)]
pub struct CommRecord {
    /// What we know of it; `None` for a handle we did not see made.
    info: RwLock<Option<CommInfo>>,
    /// Its AllReduce counters.
    pub stats: CommStats,
    /// PreMulSum ops created on it, by op value.
    redops: Mutex<HashMap<i32, PreMulSum>>,
    /// The GPU engine's state, if the engine ever took a call of it.
    pub engine: Mutex<Option<EngineSlot>>,
    /// A name of the communicator that every rank of it derives alike (from its unique id, or
    /// from its parent's name and split), once known.
    pub identity: OnceCell<u64>,
    /// Splits of this communicator so far: a child's name counts them.
    pub splits: AtomicU64,
    /// Observe mode's state of it (opaque here: the timing events are the GPU engine's).
    pub observer: Mutex<Option<Box<dyn Any + Send>>>,
    /// Calls observe mode has numbered on it (from its first, whatever it could time: every
    /// rank numbers the same calls alike).
    pub calls: AtomicU64,
}

impl CommRecord {
    /// The op `op`, if it was created on this communicator through us and not destroyed.
    pub fn redop(&self, op: RedOpCode) -> Option<PreMulSum> {
        self.redops.lock().get(&op.0).copied()
    }
}

/// Communicators by handle. Records of destroyed communicators stay (state `Destroyed`) until
/// the allocator hands the same address to a new communicator.
#[derive(Default)]
pub struct CommTable {
    entries: RwLock<HashMap<usize, Arc<CommRecord>>>,
    /// Records in state `Destroyed`: while 0, [`CommTable::is_destroyed`] is one atomic load.
    destroyed: AtomicUsize,
}

fn key(comm: ncclComm_t) -> usize {
    comm as usize
}

impl CommTable {
    /// Records a communicator that an init, split, shrink or grow call returned: a fresh
    /// record (counters at zero, no ops, no engine) in place of any older one at its address.
    pub fn insert(&self, comm: ncclComm_t, info: CommInfo) {
        let state = info.state;
        let record = CommRecord {
            info: RwLock::new(Some(info)),
            ..CommRecord::default()
        };
        let previous = self.entries.write().insert(key(comm), Arc::new(record));
        let before = previous.and_then(|p| p.info.read().as_ref().map(|i| i.state));
        self.count_transition(before, state);
    }

    /// `comm`'s record, if it has one.
    pub fn record(&self, comm: ncclComm_t) -> Option<Arc<CommRecord>> {
        self.entries.read().get(&key(comm)).cloned()
    }

    /// `comm`'s record, made (without facts) for a handle we did not see made.
    pub fn record_or_new(&self, comm: ncclComm_t) -> Arc<CommRecord> {
        if let Some(record) = self.record(comm) {
            return record;
        }
        self.entries.write().entry(key(comm)).or_default().clone()
    }

    /// Runs `f` on `comm`'s record (made, without facts, for a handle we did not see made)
    /// under the table's read lock: no reference is taken, for the per-call path. `f` must not
    /// use the table itself (a second read behind a waiting writer would deadlock).
    pub fn with_record<R>(&self, comm: ncclComm_t, f: impl FnOnce(&CommRecord) -> R) -> R {
        if let Some(record) = self.entries.read().get(&key(comm)) {
            return f(record);
        }
        let record = self.record_or_new(comm);
        f(&record)
    }

    /// Whether `comm` is a handle whose Destroy or Abort has returned (and that no new
    /// communicator has reused since). Cheap while nothing was ever destroyed.
    pub fn is_destroyed(&self, comm: ncclComm_t) -> bool {
        if self.destroyed.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.get(comm)
            .is_some_and(|info| info.state == CommState::Destroyed)
    }

    fn count_transition(&self, before: Option<CommState>, after: CommState) {
        let was = before == Some(CommState::Destroyed);
        let is = after == CommState::Destroyed;
        if is && !was {
            self.destroyed.fetch_add(1, Ordering::AcqRel);
        } else if was && !is {
            self.destroyed.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// What we know about `comm`, if we saw it made.
    pub fn get(&self, comm: ncclComm_t) -> Option<CommInfo> {
        self.entries.read().get(&key(comm))?.info.read().clone()
    }

    /// Changes what is known of `comm` with `update` (not its state); returns the result, or
    /// `None` for a handle we did not see made.
    pub fn update(&self, comm: ncclComm_t, update: impl FnOnce(&mut CommInfo)) -> Option<CommInfo> {
        let record = self.record(comm)?;
        let mut guard = record.info.write();
        let info = guard.as_mut()?;
        let state = info.state;
        update(info);
        info.state = state;
        Some(info.clone())
    }

    /// Moves `comm` to `state`. Returns the previous state, or `None` for a handle we did not
    /// see made.
    pub fn set_state(&self, comm: ncclComm_t, state: CommState) -> Option<CommState> {
        let record = self.record(comm)?;
        let mut guard = record.info.write();
        let info = guard.as_mut()?;
        let before = std::mem::replace(&mut info.state, state);
        self.count_transition(Some(before), state);
        Some(before)
    }

    /// Retires `comm` at its destroy or abort: its ops are forgotten; returns its last
    /// counters (for the report at destroy), or `None` for a handle without a record.
    pub fn retire(&self, comm: ncclComm_t) -> Option<StatsSnapshot> {
        let record = self.record(comm)?;
        record.redops.lock().clear();
        Some(record.stats.snapshot())
    }

    /// Records an op the real NCCL created on `comm`.
    pub fn insert_redop(&self, comm: ncclComm_t, op: RedOpCode, premul: PreMulSum) {
        self.record_or_new(comm).redops.lock().insert(op.0, premul);
    }

    /// The op `op` of `comm`, if it was created there through us and not destroyed.
    pub fn redop(&self, comm: ncclComm_t, op: RedOpCode) -> Option<PreMulSum> {
        self.entries.read().get(&key(comm))?.redop(op)
    }

    /// Forgets one op (after `ncclRedOpDestroy`).
    pub fn remove_redop(&self, comm: ncclComm_t, op: RedOpCode) {
        if let Some(record) = self.record(comm) {
            record.redops.lock().remove(&op.0);
        }
    }

    /// Number of live ops on `comm`.
    pub fn redop_count(&self, comm: ncclComm_t) -> usize {
        self.record(comm).map_or(0, |r| r.redops.lock().len())
    }

    /// `comm`'s AllReduce counters, if it has a record.
    pub fn stats(&self, comm: ncclComm_t) -> Option<StatsSnapshot> {
        self.record(comm).map(|r| r.stats.snapshot())
    }

    /// Every record, with its handle.
    pub fn all(&self) -> Vec<(ncclComm_t, Arc<CommRecord>)> {
        self.entries
            .read()
            .iter()
            .map(|(&k, r)| (k as ncclComm_t, r.clone()))
            .collect()
    }

    /// Number of communicators in `state`.
    pub fn count(&self, state: CommState) -> usize {
        self.entries
            .read()
            .values()
            .filter(|r| r.info.read().as_ref().is_some_and(|i| i.state == state))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(n: usize) -> ncclComm_t {
        n as ncclComm_t
    }

    fn info(origin: CommOrigin) -> CommInfo {
        CommInfo {
            nranks: Some(4),
            rank: Some(1),
            cuda_device: None,
            blocking: true,
            origin,
            state: CommState::Live,
            single_process: false,
        }
    }

    #[test]
    fn an_update_completes_what_is_known_but_never_the_state() {
        let table = CommTable::default();
        assert_eq!(table.update(handle(0x30), |i| i.rank = Some(3)), None);
        table.insert(handle(0x30), info(CommOrigin::InitRankConfig));
        table.set_state(handle(0x30), CommState::Destroyed);
        let updated = table
            .update(handle(0x30), |i| {
                i.cuda_device = Some(5);
                i.state = CommState::Live;
            })
            .unwrap();
        assert_eq!(updated.cuda_device, Some(5));
        assert_eq!(updated.state, CommState::Destroyed);
        assert!(table.is_destroyed(handle(0x30)));
    }

    #[test]
    fn lifecycle_of_one_communicator() {
        let table = CommTable::default();
        assert_eq!(table.get(handle(0x10)), None);
        table.insert(handle(0x10), info(CommOrigin::InitRank));
        assert_eq!(table.get(handle(0x10)).unwrap().rank, Some(1));
        assert_eq!(
            table.set_state(handle(0x10), CommState::Finalized),
            Some(CommState::Live)
        );
        assert_eq!(
            table.set_state(handle(0x10), CommState::Destroyed),
            Some(CommState::Finalized)
        );
        assert_eq!(table.count(CommState::Destroyed), 1);
        assert!(table.is_destroyed(handle(0x10)));
        assert!(!table.is_destroyed(handle(0x20)));
        assert_eq!(table.set_state(handle(0x20), CommState::Destroyed), None);
    }

    #[test]
    fn a_reused_address_is_a_new_communicator() {
        let table = CommTable::default();
        table.insert(handle(0x10), info(CommOrigin::InitRank));
        table.set_state(handle(0x10), CommState::Destroyed);
        table.insert(handle(0x10), info(CommOrigin::Split));
        let now = table.get(handle(0x10)).unwrap();
        assert_eq!(
            (now.origin, now.state),
            (CommOrigin::Split, CommState::Live)
        );
    }

    #[test]
    fn ops_and_counters_belong_to_their_communicator_and_start_afresh() {
        use crate::nccl::types::DataTypeCode;
        use crate::registry::fallback::Fallback;
        use crate::registry::redops::Scalar;
        let table = CommTable::default();
        let (a, b) = (handle(0x10), handle(0x20));
        table.insert(a, info(CommOrigin::InitRank));
        let op = PreMulSum {
            datatype: DataTypeCode(7),
            scalar: Scalar::Host {
                bytes: [0, 0, 0, 0x3f, 0, 0, 0, 0],
                len: 4,
            },
        };
        table.insert_redop(a, RedOpCode(5), op);
        // A handle not seen made gets a record without facts for its ops and counters.
        table.insert_redop(b, RedOpCode(5), op);
        assert_eq!(table.get(b), None);
        assert_eq!(table.redop(a, RedOpCode(5)), Some(op));
        table.remove_redop(a, RedOpCode(5));
        assert_eq!(table.redop(a, RedOpCode(5)), None);
        assert_eq!(table.redop(b, RedOpCode(5)), Some(op));
        table.insert_redop(a, RedOpCode(6), op);
        table.record_or_new(a).stats.fell_back(Fallback::InGroup);
        table.record_or_new(a).stats.ran_stragglar();
        assert_eq!(table.stats(a).map(|s| s.calls), Some(2));
        // Retired: its ops go, its last counters are reported.
        table.set_state(a, CommState::Destroyed);
        assert_eq!(table.retire(a).map(|s| s.on_stragglar), Some(1));
        assert_eq!(table.redop_count(a), 0);
        // A new communicator at the address starts from zero.
        table.insert_redop(a, RedOpCode(7), op);
        table.insert(a, info(CommOrigin::Split));
        assert_eq!(table.stats(a).map(|s| s.calls), Some(0));
        assert_eq!(table.redop_count(a), 0);
        assert!(!table.is_destroyed(a));
        assert_eq!(table.count(CommState::Destroyed), 0);
    }

    #[test]
    fn concurrent_updates_are_safe() {
        let table = std::sync::Arc::new(CommTable::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let table = table.clone();
                std::thread::spawn(move || {
                    for i in 0..500 {
                        let h = handle(0x1000 * (t + 1) + i);
                        table.insert(h, info(CommOrigin::InitRank));
                        table.set_state(h, CommState::Destroyed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(table.count(CommState::Destroyed), 2000);
    }
}
