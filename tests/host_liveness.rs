//! A wait's liveness check against a peer that finishes the call and then ends, at the worst
//! moment: right after the waiting rank's first look at the peer's header, before it asks
//! whether the peer is still there. The peer did its part of the call, so the wait must not give
//! up on it (bench runs on a loaded machine reported such peers as exited, about 1 in 9,000).
//!
//! The moment is forced, not hoped for. The peer's header page is made inaccessible; the waiting
//! rank's first access to it traps (SIGSEGV); the handler opens the page and single-steps that
//! one access (the x86 trap flag); the SIGTRAP after it plays the peer: it records the call as
//! finished, then ends the peer's process (or raises its abort word, as a failure in its next
//! call would) before the waiting rank goes on. Signal handlers belong to the whole process:
//! this file holds only these tests, and they take turns.

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use stragglar::engine::host::segment::{
    segment_name, unlink, Segment, SegmentHeader, SegmentLayout,
};
use stragglar::engine::host::wait::{Liveness, WaitError, Watch};

/// The trap flag of RFLAGS: the CPU runs one instruction, then raises SIGTRAP.
const TRAP_FLAG: libc::greg_t = 0x100;

/// The call the waiting rank is in.
const CALL: u64 = 7;

/// The peer's header page while a trap is armed; 0 otherwise.
static PEER_PAGE: AtomicUsize = AtomicUsize::new(0);
/// The write end of the peer process's stdin (closing it ends the process), or -1 when the peer
/// is a thread of this process, which aborts instead.
static PEER_STDIN: AtomicI32 = AtomicI32::new(-1);
/// A pidfd of the peer process, to wait for its exit.
static PEER_PIDFD: AtomicI32 = AtomicI32::new(-1);
/// Times the peer acted.
static TRAPS: AtomicU32 = AtomicU32::new(0);
/// The call the peer finishes when it acts.
static FINISHES: AtomicU64 = AtomicU64::new(0);

/// The tests share the handlers and the statics above.
static TURN: Mutex<()> = Mutex::new(());

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// SIGSEGV: the first access to the peer's header opens the page and single-steps the access.
extern "C" fn on_fault(_: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let page = PEER_PAGE.load(Ordering::SeqCst);
    // SAFETY: the kernel passes a valid siginfo for a SIGSEGV.
    let at = unsafe { (*info).si_addr() } as usize;
    if page == 0 || at < page || at >= page + page_size() {
        // Not the armed page: a real fault. The default action applies when it recurs.
        // SAFETY: restoring the default disposition is async-signal-safe.
        unsafe { libc::signal(libc::SIGSEGV, libc::SIG_DFL) };
        return;
    }
    // SAFETY: the page is the start of a live shared mapping of at least one page; mprotect is
    // async-signal-safe; the context is the interrupted thread's, which the kernel restores.
    unsafe {
        libc::mprotect(
            page as *mut libc::c_void,
            page_size(),
            libc::PROT_READ | libc::PROT_WRITE,
        );
        let context = &mut *(context as *mut libc::ucontext_t);
        context.uc_mcontext.gregs[libc::REG_EFL as usize] |= TRAP_FLAG;
    }
}

/// SIGTRAP, once the access has been made: the peer finishes the call, then ends.
extern "C" fn on_step(_: libc::c_int, _: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the interrupted thread's context, which the kernel restores.
    unsafe {
        let context = &mut *(context as *mut libc::ucontext_t);
        context.uc_mcontext.gregs[libc::REG_EFL as usize] &= !TRAP_FLAG;
    }
    let page = PEER_PAGE.swap(0, Ordering::SeqCst);
    if page == 0 {
        return;
    }
    // SAFETY: the armed page is the peer's header, mapped and accessible again.
    let header = unsafe { &*(page as *const SegmentHeader) };
    header
        .finished
        .store(FINISHES.load(Ordering::SeqCst), Ordering::Release);
    match PEER_STDIN.swap(-1, Ordering::SeqCst) {
        -1 => header.abort.store(1, Ordering::Release),
        stdin => {
            let mut exited = libc::pollfd {
                fd: PEER_PIDFD.load(Ordering::SeqCst),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: closing the pipe's write end ends `cat` (status 0); poll on its pidfd
            // returns once it has exited. Both are async-signal-safe.
            unsafe {
                libc::close(stdin);
                while libc::poll(&mut exited, 1, -1) != 1 {}
            }
        }
    }
    TRAPS.fetch_add(1, Ordering::SeqCst);
}

/// Installs `handler` for `signal`; returns the action it replaced.
fn install(
    signal: libc::c_int,
    handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
) -> libc::sigaction {
    // SAFETY: zeroed sigaction structs are valid; sigaction copies them.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(signal, &action, &mut old), 0);
        old
    }
}

/// Two ranks' segments: this rank's (0) and the peer's (1), names already removed.
fn segments(test: u64) -> [Segment; 2] {
    let layout = SegmentLayout {
        flags_per_bank: 1,
        arena_bytes: 64,
    };
    let comm_id = (std::process::id() as u64) << 32 | test;
    [0, 1].map(|rank| {
        let name = segment_name(comm_id, rank);
        let segment = Segment::create(&name, layout, std::process::id() as i32).unwrap();
        unlink(&name);
        segment
    })
}

/// Runs `watch.check()` with the peer acting right after the first access to its header.
fn check_with_the_peer_acting_after_the_first_look(watch: &Watch<'_>) -> Result<(), WaitError> {
    let header = watch.segments[1].header();
    header.finished.store(CALL - 1, Ordering::Release);
    FINISHES.store(CALL, Ordering::SeqCst);
    let page = header as *const SegmentHeader as usize;
    assert_eq!(page % page_size(), 0, "a header starts its mapping");
    TRAPS.store(0, Ordering::SeqCst);
    let old_fault = install(libc::SIGSEGV, on_fault);
    let old_step = install(libc::SIGTRAP, on_step);
    PEER_PAGE.store(page, Ordering::SeqCst);
    // SAFETY: the page starts the peer's mapping; only the trap handler opens it again.
    let rc = unsafe { libc::mprotect(page as *mut libc::c_void, page_size(), libc::PROT_NONE) };
    assert_eq!(rc, 0);
    let seen = watch.check();
    PEER_PAGE.store(0, Ordering::SeqCst);
    // SAFETY: as above; the page is opened in case the check never touched it.
    unsafe {
        libc::mprotect(
            page as *mut libc::c_void,
            page_size(),
            libc::PROT_READ | libc::PROT_WRITE,
        );
        libc::sigaction(libc::SIGSEGV, &old_fault, std::ptr::null_mut());
        libc::sigaction(libc::SIGTRAP, &old_step, std::ptr::null_mut());
    }
    assert_eq!(TRAPS.load(Ordering::SeqCst), 1, "the peer acted once");
    assert_eq!(header.finished.load(Ordering::Acquire), CALL);
    seen
}

#[test]
fn a_peer_process_that_finishes_the_call_and_exits_is_not_taken_for_dead() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let mut peer = Command::new("cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, peer.id() as i32, 0) };
    assert!(
        pidfd >= 0,
        "pidfd_open: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    PEER_PIDFD.store(pidfd.as_raw_fd(), Ordering::SeqCst);
    let stdin = peer.stdin.take().unwrap().into_raw_fd();
    PEER_STDIN.store(stdin, Ordering::SeqCst);
    let segments = segments(1);
    let liveness = [
        Liveness::watch(std::process::id() as i32),
        Liveness::watch(peer.id() as i32),
    ];
    let watch = Watch {
        segments: &segments,
        liveness: &liveness,
        rank: 0,
        deadline: None,
        epoch: CALL,
    };
    let seen = check_with_the_peer_acting_after_the_first_look(&watch);
    assert!(peer.wait().unwrap().success());
    assert_eq!(
        seen,
        Ok(()),
        "the peer finished call {CALL} before it exited"
    );
    let next = Watch {
        epoch: CALL + 1,
        ..watch
    };
    assert_eq!(
        next.check(),
        Err(WaitError::PeerDied(1)),
        "the peer is gone for the next call"
    );
}

#[test]
fn a_peer_that_finishes_the_call_and_fails_in_its_next_is_not_taken_for_failed() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    PEER_STDIN.store(-1, Ordering::SeqCst);
    let segments = segments(2);
    let liveness = [0, 1].map(|_| Liveness::watch(std::process::id() as i32));
    let watch = Watch {
        segments: &segments,
        liveness: &liveness,
        rank: 0,
        deadline: None,
        epoch: CALL,
    };
    assert_eq!(
        check_with_the_peer_acting_after_the_first_look(&watch),
        Ok(()),
        "the peer finished call {CALL} before it aborted"
    );
    let next = Watch {
        epoch: CALL + 1,
        ..watch
    };
    assert_eq!(next.check(), Err(WaitError::PeerFailed(1)));
}
