//! Each rank's failure word, in host memory that every rank of the communicator maps (POSIX
//! shared memory, registered with the driver so the GPUs address it): nonzero once that rank
//! failed (a `STATUS_*`). Its kernels write it when they give up; its host writes it when it
//! gives up, with a plain store, so that a rank whose GPU context is lost (where any device
//! write would fail too) still releases the peers whose kernels wait for it. Every kernel's
//! waits poll every rank's word (`RawPeer::failed`).
//!
//! The owner creates the memory under a name of its own (its pid, the clock and a counter, so
//! that processes of containers sharing `/dev/shm` do not meet), its setup record carries the
//! name, each peer opens it by that name, and the owner unlinks the name as soon as the setup
//! is over: nothing is left in `/dev/shm` unless a process dies during its setup.
//!
//! The same page holds, for the hosts alone, the word saying the rank released its peers'
//! staging, its part of the arenas' growth (`super::growth`): two round words and an IPC
//! handle, its vote on each graph capture of NCCL's work behind a conditional node
//! (`super::rank`), written by the owner, read by every peer, and its word of the setup's
//! second step (`super::setup::agreement`), which a peer may settle as timed out.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::driver::{Device, HostRegistration};

/// Bytes mapped: one page (the word is its first 4 bytes).
const PAGE: usize = 4096;

/// Word indices in the page: the failure word, the release word, then the growth's two round
/// words, the capture vote, the setup's verdict, and the growth's handle (16 words, at a
/// 64-byte boundary).
const RELEASED: usize = 1;
const OFFERED: usize = 16;
const REACHED: usize = 17;
const CAPTURE_VOTE: usize = 18;
const SETUP_VERDICT: usize = 19;
const HANDLE: usize = 32;

/// Failure words this process has created: the next name's counter.
static CREATED: AtomicU64 = AtomicU64::new(0);

/// One rank's failure word as this process maps it.
pub struct FailureWord {
    name: String,
    host: *mut u32,
    /// Dropped before the memory is unmapped (see `Drop`).
    registration: Option<HostRegistration>,
    /// Whether this process created it (and so unlinks the name), and whether it did.
    owner: bool,
    unlinked: AtomicBool,
}

// SAFETY: the word is accessed only atomically (host) or with volatile and atomic operations
// (kernels); the mapping lives as long as `self`.
unsafe impl Send for FailureWord {}
// SAFETY: as above.
unsafe impl Sync for FailureWord {}

impl FailureWord {
    /// A new failure word of this rank, reading 0, mapped for `device`.
    pub fn create(device: &Arc<Device>) -> Result<FailureWord, String> {
        Self::create_mapped(Some(device))
    }

    /// A new page for the hosts' words alone (tests of what the hosts agree through it).
    #[cfg(test)]
    pub fn create_host() -> Result<FailureWord, String> {
        Self::create_mapped(None)
    }

    /// A new failure word, registered with `device` where one is given (host words alone
    /// otherwise).
    fn create_mapped(device: Option<&Arc<Device>>) -> Result<FailureWord, String> {
        for _ in 0..16 {
            let n = CREATED.fetch_add(1, Ordering::Relaxed);
            let clock = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            // Well within the setup record's 48 bytes.
            let name = format!("/stragglar-{}-{clock:08x}-{n}", std::process::id());
            match Self::map(device, &name, true) {
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                mapped => return mapped.map_err(|e| format!("{name}: {e}")),
            }
        }
        Err("no free name for a failure word".into())
    }

    /// A peer's failure word, by the name its setup record carries.
    pub fn open(device: &Arc<Device>, name: &str) -> Result<FailureWord, String> {
        Self::map(Some(device), name, false).map_err(|e| format!("{name}: {e}"))
    }

    /// A rank's page by the name its setup record carries, for its hosts' words alone: not
    /// registered with any device (its device address is 0), so that a host whose GPU context
    /// is lost can still open it.
    pub fn open_host(name: &str) -> Result<FailureWord, String> {
        Self::map(None, name, false).map_err(|e| format!("{name}: {e}"))
    }

    fn map(device: Option<&Arc<Device>>, name: &str, create: bool) -> std::io::Result<FailureWord> {
        let c_name = CString::new(name).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let flags = match create {
            true => libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
            false => libc::O_RDWR,
        };
        // SAFETY: a NUL-terminated name; the descriptor is closed below.
        let fd = unsafe { libc::shm_open(c_name.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is ours; a new segment is sized to one page (an existing one already is).
        let sized = !create || unsafe { libc::ftruncate(fd, PAGE as libc::off_t) } == 0;
        let host = match sized {
            // SAFETY: maps one page of the segment shared; checked below.
            true => unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            },
            false => libc::MAP_FAILED,
        };
        let error = std::io::Error::last_os_error();
        // SAFETY: `fd` is ours, closed once; the mapping (if any) keeps the segment.
        unsafe { libc::close(fd) };
        if host == libc::MAP_FAILED {
            if create {
                // SAFETY: the name this call just created.
                unsafe { libc::shm_unlink(c_name.as_ptr()) };
            }
            return Err(error);
        }
        let mut word = FailureWord {
            name: name.to_string(),
            host: host.cast(),
            registration: None,
            owner: create,
            unlinked: AtomicBool::new(false),
        };
        if let Some(device) = device {
            // SAFETY: `host` is a page-aligned mapping of PAGE bytes that lives as long as
            // `word`, whose Drop unregisters before unmapping.
            let registration = unsafe { HostRegistration::new(device, host, PAGE) }
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            word.registration = Some(registration);
        }
        Ok(word)
    }

    /// The shared memory's name, for the setup record.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where this process's GPU addresses the word.
    pub fn device_address(&self) -> u64 {
        self.registration.as_ref().map_or(0, |r| r.device_ptr)
    }

    fn word(&self) -> &AtomicU32 {
        // SAFETY: the first word of a live page-aligned mapping, accessed only atomically.
        unsafe { AtomicU32::from_ptr(self.host) }
    }

    /// Word `index` of the page (below [`HANDLE`] + 16), beside the failure word: accessed
    /// only atomically, by hosts alone.
    fn host_word(&self, index: usize) -> &AtomicU32 {
        debug_assert!(index > 0 && index < HANDLE + 16);
        // SAFETY: a word inside the same live page-aligned mapping of PAGE bytes, accessed only
        // atomically.
        unsafe { AtomicU32::from_ptr(self.host.add(index)) }
    }

    fn released_word(&self) -> &AtomicU32 {
        self.host_word(RELEASED)
    }

    /// Offers this rank's part of growth `growth` (numbered from 1, alike on every rank): the
    /// IPC handle of its new arenas, or `None` when it could not make them.
    pub fn offer_growth(&self, growth: u32, handle: Option<&[u8; 64]>) {
        if let Some(handle) = handle {
            for (i, bytes) in handle.chunks(4).enumerate() {
                let word = u32::from_le_bytes(bytes.try_into().expect("4 bytes"));
                self.host_word(HANDLE + i).store(word, Ordering::Relaxed);
            }
        }
        let offered = growth << 1 | u32::from(handle.is_some());
        self.host_word(OFFERED).store(offered, Ordering::Release);
    }

    /// The rank's offer for growth `growth` once made: its handle, or `None` if it could not.
    pub fn growth_offer(&self, growth: u32) -> Option<Option<[u8; 64]>> {
        let offered = self.host_word(OFFERED).load(Ordering::Acquire);
        if offered >> 1 != growth {
            return None;
        }
        if offered & 1 == 0 {
            return Some(None);
        }
        let mut handle = [0u8; 64];
        for (i, bytes) in handle.chunks_mut(4).enumerate() {
            let word = self.host_word(HANDLE + i).load(Ordering::Relaxed);
            bytes.copy_from_slice(&word.to_le_bytes());
        }
        Some(Some(handle))
    }

    /// Says whether this rank reached every peer's new arenas of growth `growth`.
    pub fn reach_growth(&self, growth: u32, reached: bool) {
        self.say(REACHED, growth, reached);
    }

    /// Whether the rank reached every peer's new arenas of growth `growth`, once it said.
    pub fn growth_reached(&self, growth: u32) -> Option<bool> {
        self.said(REACHED, growth)
    }

    /// Says whether this rank can put NCCL's work of its graph capture number `capture` behind
    /// a conditional node.
    pub fn vote_capture(&self, capture: u32, behind: bool) {
        self.say(CAPTURE_VOTE, capture, behind);
    }

    /// What the rank voted on its capture number `capture`, once it did.
    pub fn capture_vote(&self, capture: u32) -> Option<bool> {
        self.said(CAPTURE_VOTE, capture)
    }

    /// Settles the rank's word of the setup's second step to `verdict` (nonzero) unless it was
    /// settled already (by the rank, or by a peer that stopped waiting for it); returns what
    /// it holds. Written once: every rank that reads it reads the same.
    pub fn settle_setup(&self, verdict: u32) -> u32 {
        match self.host_word(SETUP_VERDICT).compare_exchange(
            0,
            verdict,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => verdict,
            Err(settled) => settled,
        }
    }

    /// The rank's word of the setup's second step: 0 until settled.
    pub fn setup_verdict(&self) -> u32 {
        self.host_word(SETUP_VERDICT).load(Ordering::Acquire)
    }

    /// Writes round `round`'s yes or no into word `index` (rounds below 2^31).
    fn say(&self, index: usize, round: u32, yes: bool) {
        self.host_word(index)
            .store(round << 1 | u32::from(yes), Ordering::Release);
    }

    /// Round `round`'s answer in word `index`, once written.
    fn said(&self, index: usize, round: u32) -> Option<bool> {
        let word = self.host_word(index).load(Ordering::Acquire);
        (word >> 1 == round).then_some(word & 1 == 1)
    }

    /// Says, in the word beside the failure word, that the rank has closed its mappings of
    /// every peer's staging of this communicator: a peer may free its own then (freeing
    /// exported memory that a peer still maps is undefined behaviour). Written after the
    /// closes, by the host, which may do it whatever its GPU's state.
    pub fn mark_released(&self) {
        self.released_word().store(1, Ordering::Release);
    }

    /// Whether the rank has said [`mark_released`](Self::mark_released).
    pub fn released(&self) -> bool {
        self.released_word().load(Ordering::Acquire) == 1
    }

    /// Marks the rank failed with `status` (nonzero), keeping an earlier status.
    pub fn set(&self, status: u32) {
        let _ = self
            .word()
            .compare_exchange(0, status, Ordering::Release, Ordering::Relaxed);
    }

    /// The word: 0 while the rank has not failed.
    pub fn get(&self) -> u32 {
        self.word().load(Ordering::Acquire)
    }

    /// Removes the name (the owner's, once every peer opened it): the memory lives on while
    /// anyone maps it. Idempotent.
    pub fn unlink(&self) {
        if !self.owner || self.unlinked.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok(name) = CString::new(self.name.as_str()) {
            // SAFETY: a NUL-terminated name of ours, removed once.
            unsafe { libc::shm_unlink(name.as_ptr()) };
        }
    }
}

impl Drop for FailureWord {
    fn drop(&mut self) {
        self.registration = None;
        self.unlink();
        // SAFETY: the mapping made in `map`, unmapped once, after its registration ended.
        unsafe { libc::munmap(self.host.cast(), PAGE) };
    }
}
