//! The one clock every process of a machine shares: arrival records, traces and report
//! intervals are compared across ranks in nanoseconds of it.

/// CLOCK_MONOTONIC in nanoseconds (the same clock in every process of the machine).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
