//! Futex wait and wake on a 32-bit word in shared memory (process-shared: no PRIVATE flag).

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, at most `timeout`. Returns on a wake, a timeout, a changed
/// word or a signal alike: callers re-check the word.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned 32-bit atomic for the duration of the call; FUTEX_WAIT
    // only reads it. A shared mapping makes it visible to other processes' wakes.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every waiter sleeping on `word`.
pub fn wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_returns_on_wake_and_on_timeout() {
        let word = Arc::new(AtomicU32::new(0));
        let t = Instant::now();
        wait(&word, 0, Duration::from_millis(20));
        assert!(t.elapsed() >= Duration::from_millis(15));
        wait(&word, 1, Duration::from_secs(10));
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "a changed word returns at once"
        );
        let w = word.clone();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            w.store(1, Ordering::Release);
            wake_all(&w);
        });
        while word.load(Ordering::Acquire) == 0 {
            wait(&word, 0, Duration::from_secs(10));
        }
        waker.join().unwrap();
    }
}
