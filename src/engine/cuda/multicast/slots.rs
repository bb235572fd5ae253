//! Our multicast objects on this host, counted over every process of every job of this user, so
//! that the engine never takes more than `STRAGGLAR_MULTICAST_OBJECTS` of the NVSwitch's
//! multicast objects. The switch has few (128 on an HGX H100/H200 board, as reported by NCCL's
//! users), NCCL's NVLS takes its own from the same pool for each communicator it runs on, and
//! NCCL has been seen to fail a job outright when none was left. The engine's own objects stay
//! within the cap, and a team that would go beyond it is declined on every rank alike (the
//! create step fails) while NCCL keeps the rest.
//!
//! A slot is a file `object-K` (`K` below the cap) in a directory on the host's shared memory
//! file system, held under an exclusive `flock` for as long as the object lives: the lock goes
//! with its process, so a crashed job leaves no slot taken, and two processes (or two opens in
//! one process) never hold the same slot.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Names a directory to count in instead of [`host_dir`], for tests only: tests that cap the
/// engine's objects count apart from any job or other test run of this user.
const TEST_DIR_VARIABLE: &str = "STRAGGLAR_TEST_MULTICAST_SLOTS";

/// How long [`take`] waits before trying the slots it found locked once more: `stragglar
/// doctor` counts by locking each free slot for an instant, which must not cost a job a slot.
const RETRY_AFTER: Duration = Duration::from_millis(20);

/// Where the processes of this user count their multicast objects: the shared memory file
/// system, which NCCL's own shared-memory transport needs the ranks of a host to share (or the
/// directory `STRAGGLAR_TEST_MULTICAST_SLOTS` names, in tests).
pub fn host_dir() -> PathBuf {
    if let Some(dir) = test_dir() {
        return dir;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    PathBuf::from(format!("/dev/shm/stragglar-multicast-{uid}"))
}

/// The directory `STRAGGLAR_TEST_MULTICAST_SLOTS` names (tests only), if it is set: the
/// engine counts there instead of with the host's other jobs, which `stragglar doctor` says.
pub fn test_dir() -> Option<PathBuf> {
    std::env::var_os(TEST_DIR_VARIABLE)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// One multicast object counted against the cap, until dropped (the lock is released when the
/// file closes).
#[derive(Debug)]
pub struct ObjectSlot {
    _file: File,
    /// Which slot, below the cap.
    index: usize,
}

impl ObjectSlot {
    /// Which slot, below the cap (the log names it).
    pub fn index(&self) -> usize {
        self.index
    }
}

/// Takes a free slot of the `cap` in `dir` (made if absent, for this user only), or says why
/// none was taken: all `cap` held, or the directory unusable (not this user's own directory,
/// with no access for others). A slot found locked is tried once more after [`RETRY_AFTER`].
pub fn take(dir: &Path, cap: usize) -> Result<ObjectSlot, String> {
    take_after(dir, cap, || std::thread::sleep(RETRY_AFTER))
}

/// [`take`], with `pause` run between the first look at every slot and the second at the
/// slots found locked.
fn take_after(dir: &Path, cap: usize, pause: impl FnOnce()) -> Result<ObjectSlot, String> {
    if cap == 0 {
        return Err(
            "STRAGGLAR_MULTICAST_OBJECTS is 0: the engine makes no multicast object".into(),
        );
    }
    private_dir(dir)?;
    let mut locked = Vec::new();
    for index in 0..cap {
        match try_slot(dir, index)? {
            Some(slot) => return Ok(slot),
            None => locked.push(index),
        }
    }
    pause();
    for index in locked {
        if let Some(slot) = try_slot(dir, index)? {
            return Ok(slot);
        }
    }
    Err(format!(
        "all {cap} of the engine's multicast objects on this host are in use (STRAGGLAR_MULTICAST_OBJECTS; the switch's others stay NCCL's)"
    ))
}

/// Makes `dir` if absent and checks that it is this user's own directory (not a link) that
/// nobody else may enter: another user's could hold or deny every slot.
fn private_dir(dir: &Path) -> Result<(), String> {
    let unusable = |why: String| format!("counting multicast objects in {}: {why}", dir.display());
    // Only the last component: a missing parent (no /dev/shm) is an error, not made here.
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(unusable(e.to_string()))
        }
        _ => {}
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| unusable(e.to_string()))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if !meta.file_type().is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(unusable(format!(
            "not a directory of this user's (uid {uid}) with no access for others"
        )));
    }
    Ok(())
}

/// Slot `index` in `dir`, held from now on, or `None` if another open holds it.
fn try_slot(dir: &Path, index: usize) -> Result<Option<ObjectSlot>, String> {
    let path = dir.join(format!("object-{index}"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| format!("counting multicast objects in {}: {e}", path.display()))?;
    // SAFETY: the descriptor is open (owned by `file`, which outlives the call); flock only
    // reads its arguments.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if locked == 0 {
        return Ok(Some(ObjectSlot { _file: file, index }));
    }
    let error = std::io::Error::last_os_error();
    if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(format!("locking {}: {error}", path.display()));
    }
    Ok(None)
}

/// How many of the `cap` slots in `dir` are held now (by any process, this one included):
/// each is tried and, if free, let go at once ([`take`] tries a slot found locked again, so
/// this never costs a job one).
pub fn in_use(dir: &Path, cap: usize) -> usize {
    (0..cap)
        .filter(|index| {
            let Ok(file) = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(dir.join(format!("object-{index}")))
            else {
                return false;
            };
            // SAFETY: the descriptor is open (owned by `file`, which outlives the call); flock
            // only reads its arguments. The lock, if taken, goes when `file` closes.
            let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
            locked != 0
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "stragglar-slots-{name}-{}-{}",
            std::process::id(),
            crate::clock::now_ns()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_slot_is_held_until_dropped_and_the_cap_is_never_passed() {
        let dir = scratch("cap");
        let first = take(&dir, 2).unwrap();
        let second = take(&dir, 2).unwrap();
        assert_ne!(first.index(), second.index());
        let refused = take(&dir, 2).unwrap_err();
        assert!(
            refused.contains("all 2 of the engine's multicast objects"),
            "{refused}"
        );
        drop(first);
        assert_eq!(in_use(&dir, 2), 1);
        let again = take(&dir, 2).unwrap();
        assert_eq!(again.index(), 0);
        assert_eq!(in_use(&dir, 2), 2);
        assert!(take(&dir, 0).unwrap_err().contains("is 0"));
        drop((second, again));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Another process's lock counts, and goes when that process ends (killed, as a crashed
    /// job would be).
    #[test]
    fn another_process_holding_a_slot_counts_until_it_dies() {
        let dir = scratch("process");
        private_dir(&dir).unwrap();
        let held = dir.join("object-0");
        let mut holder = Command::new("flock")
            .args(["--exclusive", "--no-fork"])
            .arg(&held)
            .args(["sleep", "60"])
            .stdout(Stdio::null())
            .spawn()
            .expect("util-linux's flock");
        // Until the holder has its lock, slot 0 may still be free: wait for it to be taken.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            match take(&dir, 1) {
                Err(why) => {
                    assert!(why.contains("all 1 of"), "{why}");
                    break;
                }
                Ok(slot) => {
                    drop(slot);
                    assert!(
                        std::time::Instant::now() < deadline,
                        "flock never took its lock"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        }
        assert_eq!(take(&dir, 2).unwrap().index(), 1);
        assert_eq!(in_use(&dir, 2), 1);
        holder.kill().unwrap();
        holder.wait().unwrap();
        assert_eq!(in_use(&dir, 2), 0);
        assert_eq!(take(&dir, 1).unwrap().index(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `stragglar doctor` counts by locking each free slot for an instant: a job taking the
    /// last free slot then finds it locked, and must take it on its second look.
    #[test]
    fn a_count_by_doctor_costs_no_job_its_slot() {
        let dir = scratch("probe");
        private_dir(&dir).unwrap();
        let probe = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(dir.join("object-0"))
            .unwrap();
        // SAFETY: the descriptor is open (owned by `probe`); flock only reads its arguments.
        let locked = unsafe { libc::flock(probe.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
        assert_eq!(locked, 0);
        // The count ends between the job's two looks.
        let slot = take_after(&dir, 1, move || drop(probe)).unwrap();
        assert_eq!(slot.index(), 0);
        drop(slot);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A directory others may enter, or a link in its place, could let another user hold or
    /// deny every slot: no slot is taken there.
    #[test]
    fn a_directory_others_may_enter_or_a_link_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let open = scratch("open");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let why = take(&open, 1).unwrap_err();
        assert!(why.contains("with no access for others"), "{why}");
        let own = scratch("own");
        private_dir(&own).unwrap();
        let link = scratch("link");
        std::os::unix::fs::symlink(&own, &link).unwrap();
        let why = take(&link, 1).unwrap_err();
        assert!(why.contains("not a directory of this user's"), "{why}");
        assert!(take(&own, 1).is_ok());
        for dir in [&open, &own] {
            std::fs::remove_dir_all(dir).unwrap();
        }
        std::fs::remove_file(&link).unwrap();
    }
}
