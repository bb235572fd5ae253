//! The boundary every export passes through: a panic guard, NULL-output checks and the value a
//! function returns when it cannot do its job.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::nccl::types::{ncclComm_t, ncclTeam_t, ResultCode};

/// What an export returns when it fails before or instead of reaching the real NCCL.
pub trait FailureValue {
    /// The value that reports `code` in this return type.
    fn from_code(code: ResultCode) -> Self;
}

impl FailureValue for ResultCode {
    fn from_code(code: ResultCode) -> Self {
        code
    }
}

impl FailureValue for () {
    fn from_code(_: ResultCode) -> Self {}
}

/// Functions returning `int` (device-API rank maps, slot counts) report failure as -1.
impl FailureValue for c_int {
    fn from_code(_: ResultCode) -> Self {
        -1
    }
}

/// Functions returning a string report failure with our own message.
impl FailureValue for *const c_char {
    fn from_code(code: ResultCode) -> Self {
        super::result_text::own_error_string(code).as_ptr()
    }
}

/// Device-API teams report failure as the empty team.
impl FailureValue for ncclTeam_t {
    fn from_code(_: ResultCode) -> Self {
        ncclTeam_t::default()
    }
}

/// Runs an export's body; a panic becomes `ncclInternalError` (or the return type's failure
/// value) and one ERROR line, never an unwind into C.
#[inline]
pub fn guard<R: FailureValue>(function: &'static str, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            log::error!("internal error in {function}: {what}; returning ncclInternalError");
            R::from_code(ResultCode::INTERNAL_ERROR)
        }
    }
}

/// Logs, once per call site, that `function` got a NULL `argument`, and returns
/// `ncclInvalidArgument`.
#[cold]
pub fn reject_null(warned: &AtomicBool, function: &str, argument: &str) -> ResultCode {
    if !warned.swap(true, Ordering::Relaxed) {
        log::warn!("{function}: {argument} is NULL; returning ncclInvalidArgument");
    }
    ResultCode::INVALID_ARGUMENT
}

/// Refuses, with one WARN per call site, a device-API team with no ranks, a rank outside it or
/// a stride below 1: NCCL divides by these and would crash the process.
pub fn reject_team(warned: &AtomicBool, function: &str, argument: &str) -> ResultCode {
    if !warned.swap(true, Ordering::Relaxed) {
        log::warn!(
            "{function}: {argument} is not a team (nRanks < 1, rank outside it, or stride < 1); returning ncclInvalidArgument"
        );
    }
    ResultCode::INVALID_ARGUMENT
}

/// Refuses, with one WARN per call site, arguments that fail a requirement `why` states.
pub fn reject_value(warned: &AtomicBool, function: &str, why: &str) -> ResultCode {
    if !warned.swap(true, Ordering::Relaxed) {
        log::warn!("{function}: {why}; returning ncclInvalidArgument");
    }
    ResultCode::INVALID_ARGUMENT
}

/// Refuses, with one WARN per call site, an application's call on a communicator whose Destroy
/// or Abort has already returned: forwarding it would be a use after free inside NCCL. The
/// calls NCCL makes itself during teardown pass.
#[inline]
pub fn check_live(comm: ncclComm_t, warned: &AtomicBool, function: &str) -> Result<(), ResultCode> {
    if !crate::registry::comms().is_destroyed(comm) || crate::nccl::reentry::inside_real_nccl() {
        return Ok(());
    }
    if !warned.swap(true, Ordering::Relaxed) {
        log::warn!("{function}: communicator {comm:p} was already destroyed or aborted; returning ncclInvalidArgument");
    }
    Err(ResultCode::INVALID_ARGUMENT)
}

/// A `&'static CStr` from a NUL-terminated literal, at compile time.
pub const fn cstr(text: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(text.as_bytes()) {
        Ok(s) => s,
        Err(_) => panic!("symbol name is not NUL-terminated"),
    }
}
