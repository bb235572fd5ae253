//! Error strings: forwarded when a real NCCL is bound, answered from our own table when not.

use std::ffi::CStr;
use std::os::raw::c_char;

use once_cell::sync::OnceCell;

use super::guard::guard;
use super::result_text::own_error_string;
use crate::forward;
use crate::nccl::types::{ncclComm_t, ResultCode};
use crate::nccl::{binding, BindError};

/// `ncclGetLastError`'s answer when no real NCCL is bound: why not.
fn bind_failure_text(error: &BindError) -> &'static CStr {
    static TEXT: OnceCell<std::ffi::CString> = OnceCell::new();
    TEXT.get_or_init(|| {
        std::ffi::CString::new(format!("stragglar: {error}"))
            .unwrap_or_else(|_| c"stragglar: no real NCCL bound".into())
    })
}

/// Returns the text of a result code: the real NCCL's, or ours when none is bound.
#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: ResultCode) -> *const c_char {
    guard("ncclGetErrorString", || {
        if binding().is_err() {
            return own_error_string(result).as_ptr();
        }
        forward!(ncclGetErrorString(result))
    })
}

/// Returns the real NCCL's last error (one buffer for the whole process, as in NCCL), or why no
/// real NCCL is bound.
#[no_mangle]
pub extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    guard("ncclGetLastError", || {
        if let Err(e) = binding() {
            return bind_failure_text(e).as_ptr();
        }
        forward!(ncclGetLastError(comm))
    })
}
