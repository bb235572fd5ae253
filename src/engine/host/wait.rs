//! Waiting for a peer's flag: spin briefly, then sleep on the futex in short slices, watching
//! abort words, peer liveness and the deadline.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::futex;
use super::segment::Segment;

/// Spins before the first sleep: enough for a peer on another core that is about to publish.
const SPINS: u32 = 2000;
/// Longest single sleep: how often aborts, deaths and the deadline are noticed.
const SLICE: Duration = Duration::from_millis(5);

/// Why a wait gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitError {
    /// This rank was aborted.
    Aborted,
    /// Rank `0` raised its abort word (it aborted or failed).
    PeerFailed(usize),
    /// Rank `0`'s process exited.
    PeerDied(usize),
    /// `STRAGGLAR_TIMEOUT_MS` passed.
    Timeout,
}

/// Whether a process is still running: by a pidfd, which also sees an exited but unreaped
/// process as exited; by `kill(pid, 0)` where pidfds are unavailable (kernels before 5.3).
pub enum Liveness {
    /// This process (threads mode): always alive.
    Itself,
    Pidfd(OwnedFd),
    Pid(i32),
}

impl Liveness {
    /// Watches `pid`.
    pub fn watch(pid: i32) -> Liveness {
        if pid == std::process::id() as i32 {
            return Liveness::Itself;
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            log::warn!(
                "cannot watch process {pid} with a pidfd ({}); falling back to kill(pid, 0), which sees an unreaped exit late",
                std::io::Error::last_os_error()
            );
            return Liveness::Pid(pid);
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        Liveness::Pidfd(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    /// Whether the process has exited.
    pub fn exited(&self) -> bool {
        match self {
            Liveness::Itself => false,
            Liveness::Pidfd(fd) => {
                let mut pfd = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, zero timeout.
                let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
                rc > 0 && pfd.revents & libc::POLLIN != 0
            }
            Liveness::Pid(pid) => {
                // SAFETY: signal 0 only checks that the process exists.
                let rc = unsafe { libc::kill(*pid, 0) };
                rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
            }
        }
    }
}

/// What every wait of one rank watches.
pub struct Watch<'a> {
    /// Every rank's segment, by rank (this rank's included).
    pub segments: &'a [Segment],
    /// Every rank's liveness, by rank.
    pub liveness: &'a [Liveness],
    /// This rank.
    pub rank: usize,
    /// When to give up, if ever.
    pub deadline: Option<Instant>,
    /// The call being waited in.
    pub epoch: u64,
}

impl Watch<'_> {
    /// The first reason to stop waiting, if any.
    ///
    /// A peer that finished this call has done its part: whatever it does next (exit, or fail
    /// and abort in its next call) is no reason to stop. Its `finished` word is written before
    /// either, so it is read again once the abort word or the exit has been seen: a peer may
    /// finish and end between a first read and the look at its abort word or process.
    pub fn check(&self) -> Result<(), WaitError> {
        if self.segments[self.rank]
            .header()
            .abort
            .load(Ordering::Acquire)
            != 0
        {
            return Err(WaitError::Aborted);
        }
        for (rank, (segment, live)) in self.segments.iter().zip(self.liveness).enumerate() {
            let header = segment.header();
            if rank == self.rank || header.finished.load(Ordering::Acquire) >= self.epoch {
                continue;
            }
            let gone = if header.abort.load(Ordering::Acquire) != 0 {
                WaitError::PeerFailed(rank)
            } else if live.exited() {
                WaitError::PeerDied(rank)
            } else {
                continue;
            };
            // The abort word was read with acquire; the exit was seen by a syscall, so the
            // fence orders the read below after it.
            fence(Ordering::Acquire);
            if header.finished.load(Ordering::Acquire) < self.epoch {
                return Err(gone);
            }
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(WaitError::Timeout);
        }
        Ok(())
    }

    /// Waits until `flag` holds `epoch`.
    pub fn until(&self, flag: &AtomicU32, epoch: u32) -> Result<(), WaitError> {
        for _ in 0..SPINS {
            if flag.load(Ordering::Acquire) == epoch {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        loop {
            let seen = flag.load(Ordering::Acquire);
            if seen == epoch {
                return Ok(());
            }
            self.check()?;
            futex::wait(flag, seen, SLICE);
        }
    }
}

/// Publishes `epoch` in `flag` (after the data it guards) and wakes its waiters.
pub fn publish(flag: &AtomicU32, epoch: u32) {
    flag.store(epoch, Ordering::Release);
    futex::wake_all(flag);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_child_is_noticed() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let live = Liveness::watch(child.id() as i32);
        child.wait().unwrap();
        assert!(live.exited());
        let zombie = std::process::Command::new("true").spawn().unwrap();
        let live = Liveness::watch(zombie.id() as i32);
        let t = Instant::now();
        while !live.exited() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "an unreaped exit counts as exited"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(zombie);
        assert!(!Liveness::watch(std::process::id() as i32).exited());
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let by_pid = Liveness::Pid(child.id() as i32);
        assert!(!by_pid.exited());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(by_pid.exited(), "a reaped process is gone for kill(pid, 0)");
    }
}
