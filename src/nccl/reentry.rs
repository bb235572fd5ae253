//! Telling the application's calls apart from NCCL's own.
//!
//! While a tracking export (init, split, destroy, group end, ...) is inside the real NCCL, the
//! calls NCCL makes to its own exported names through the PLT reach our exports. They must
//! pass straight through: no bookkeeping, no interception. A per-thread depth marks that window.

use std::cell::Cell;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread is inside a real NCCL call made by one of our tracking exports.
pub fn inside_real_nccl() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// Runs `call` (a call into the real NCCL) with the window marked, even if it panics.
pub fn calling_real<R>(call: impl FnOnce() -> R) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
    DEPTH.with(|d| d.set(d.get() + 1));
    let _leave = Leave;
    call()
}

/// Whether a tracking export should keep books for this call: the library is enabled and the
/// call comes from the application, not from inside NCCL.
pub fn tracking() -> bool {
    crate::config::get().enabled && !inside_real_nccl()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_nests_and_closes_on_panic() {
        assert!(!inside_real_nccl());
        calling_real(|| {
            assert!(inside_real_nccl());
            calling_real(|| assert!(inside_real_nccl()));
            assert!(inside_real_nccl());
        });
        assert!(!inside_real_nccl());
        let _ = std::panic::catch_unwind(|| calling_real(|| panic!("boom")));
        assert!(!inside_real_nccl());
    }
}
