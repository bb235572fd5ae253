//! The side table of communicators, keyed by the real `ncclComm_t` (returned to the caller
//! unchanged).

use std::collections::HashMap;

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

use crate::nccl::types::ncclComm_t;

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

/// Communicators by handle. Entries of destroyed communicators stay (state `Destroyed`) until
/// the allocator hands the same address to a new communicator.
#[derive(Default)]
pub struct CommTable {
    entries: RwLock<HashMap<usize, CommInfo>>,
    /// Entries in state `Destroyed`: while 0, [`CommTable::is_destroyed`] is one atomic load.
    destroyed: AtomicUsize,
}

fn key(comm: ncclComm_t) -> usize {
    comm as usize
}

impl CommTable {
    /// Records a communicator that an init, split, shrink or grow call returned.
    pub fn insert(&self, comm: ncclComm_t, info: CommInfo) {
        let state = info.state;
        let previous = self.entries.write().insert(key(comm), info);
        self.count_transition(previous.map(|p| p.state), state);
    }

    /// Whether `comm` is a handle whose Destroy or Abort has returned (and that no new
    /// communicator has reused since). Cheap while nothing was ever destroyed.
    pub fn is_destroyed(&self, comm: ncclComm_t) -> bool {
        if self.destroyed.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.entries
            .read()
            .get(&key(comm))
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
        self.entries.read().get(&key(comm)).cloned()
    }

    /// Changes what is known of `comm` with `update` (not its state); returns the result, or
    /// `None` for an unknown handle.
    pub fn update(&self, comm: ncclComm_t, update: impl FnOnce(&mut CommInfo)) -> Option<CommInfo> {
        let mut entries = self.entries.write();
        let info = entries.get_mut(&key(comm))?;
        let state = info.state;
        update(info);
        info.state = state;
        Some(info.clone())
    }

    /// Moves `comm` to `state`. Returns the previous state, or `None` for an unknown handle.
    pub fn set_state(&self, comm: ncclComm_t, state: CommState) -> Option<CommState> {
        let mut entries = self.entries.write();
        let info = entries.get_mut(&key(comm))?;
        let before = std::mem::replace(&mut info.state, state);
        self.count_transition(Some(before), state);
        Some(before)
    }

    /// Number of communicators in `state`.
    pub fn count(&self, state: CommState) -> usize {
        self.entries
            .read()
            .values()
            .filter(|i| i.state == state)
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
