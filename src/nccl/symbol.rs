//! One lazily resolved function of the real NCCL.
//!
//! Each forwarder owns a `static` [`Symbol`]. After the first call, resolving is one atomic
//! load: the forwarding overhead budget (about 20 ns) has no room for more.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::loader::{binding, version_string};
use super::types::ResultCode;

/// Not looked up yet.
const UNRESOLVED: usize = 0;
/// Looked up; the bound library lacks it.
const MISSING: usize = 1;

/// A function of the real NCCL, looked up by its profiling name `pncclX` first and by `ncclX`
/// for libraries built without the profiling twins.
pub struct Symbol {
    profiling_name: &'static CStr,
    plain_name: &'static CStr,
    /// `UNRESOLVED`, `MISSING`, or the function's address.
    state: AtomicUsize,
}

impl Symbol {
    /// A symbol named `pncclX` / `ncclX`.
    pub const fn new(profiling_name: &'static CStr, plain_name: &'static CStr) -> Self {
        Symbol {
            profiling_name,
            plain_name,
            state: AtomicUsize::new(UNRESOLVED),
        }
    }

    /// The function's address, or the code a forwarder returns when it cannot call it:
    /// `ncclSystemError` when no real NCCL is bound, `ncclInvalidUsage` when the bound one lacks
    /// this function (with one WARN naming the function and the bound version).
    #[inline]
    pub fn address(&self) -> Result<*mut c_void, ResultCode> {
        let state = self.state.load(Ordering::Acquire);
        if state > MISSING {
            return Ok(state as *mut c_void);
        }
        self.resolve(state)
    }

    #[cold]
    fn resolve(&self, state: usize) -> Result<*mut c_void, ResultCode> {
        if state == MISSING {
            return Err(ResultCode::INVALID_USAGE);
        }
        let real = binding().map_err(|_| ResultCode::SYSTEM_ERROR)?;
        match real
            .lookup(self.profiling_name)
            .or_else(|| real.lookup(self.plain_name))
        {
            Some(addr) => {
                log::trace!(
                    "{} resolved in {}",
                    self.plain_name.to_string_lossy(),
                    real.path
                );
                self.state.store(addr as usize, Ordering::Release);
                Ok(addr)
            }
            None => {
                if self
                    .state
                    .compare_exchange(UNRESOLVED, MISSING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    log::warn!(
                        "{} is not provided by the bound NCCL {} ({}): returning ncclInvalidUsage",
                        self.plain_name.to_string_lossy(),
                        real.version
                            .map_or("(version unknown)".to_string(), version_string),
                        real.path
                    );
                }
                Err(ResultCode::INVALID_USAGE)
            }
        }
    }
}

impl Symbol {
    /// The function as a pointer of type `F`, or the code a caller returns when it cannot call
    /// it (see [`Symbol::address`]).
    ///
    /// # Safety
    /// `F` must be the C signature of the NCCL function this symbol names.
    #[inline]
    pub unsafe fn function<F: Copy>(&self) -> Result<F, ResultCode> {
        let addr = self.address()?;
        // SAFETY: as the caller vouches.
        Ok(unsafe { cast(addr) })
    }
}

/// Reinterprets `addr` as a function pointer of the same type as `template` (for `forward!`,
/// which spells the type by naming the export).
///
/// # Safety
/// `addr` must be the address of a function whose C signature is the one `F` describes.
#[inline(always)]
pub unsafe fn cast_like<F: Copy>(_template: F, addr: *mut c_void) -> F {
    // SAFETY: as the caller vouches.
    unsafe { cast(addr) }
}

/// Reinterprets `addr` as a function pointer of type `F`.
///
/// # Safety
/// `addr` must be the address of a function whose C signature is the one `F` describes.
#[inline(always)]
unsafe fn cast<F: Copy>(addr: *mut c_void) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: F is a function-pointer type of pointer size (asserted above) and the caller
    // guarantees the signature matches.
    unsafe { std::mem::transmute_copy(&addr) }
}
