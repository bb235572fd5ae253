//! Error strings: forwarded when a real NCCL is bound, answered from our own table when not.

use std::ffi::CStr;
use std::os::raw::c_char;

use once_cell::sync::OnceCell;

use super::guard::guard;
use crate::forward;
use crate::nccl::types::{ncclComm_t, ResultCode};
use crate::nccl::{binding, BindError};

/// Our own text for each result code, worded as NCCL 2.32 words it (with a pointer to our log
/// variable where NCCL points to its own).
pub fn own_error_string(code: ResultCode) -> &'static CStr {
    match code.0 {
        0 => c"no error",
        1 => {
            c"unhandled cuda error (run with STRAGGLAR_DEBUG=INFO and NCCL_DEBUG=INFO for details)"
        }
        2 => c"unhandled system error (run with STRAGGLAR_DEBUG=INFO for details)",
        3 => c"internal error - please report this issue to the stragglar developers",
        4 => c"invalid argument (run with STRAGGLAR_DEBUG=WARN for details)",
        5 => c"invalid usage (run with STRAGGLAR_DEBUG=WARN for details)",
        6 => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        8 => c"timeout",
        _ => c"unknown result code",
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_strings_cover_every_code_and_unknown_ones() {
        for code in 0..=8 {
            assert_ne!(
                own_error_string(ResultCode(code)),
                c"unknown result code",
                "{code}"
            );
        }
        for code in [-1, 9, 1000] {
            assert_eq!(own_error_string(ResultCode(code)), c"unknown result code");
        }
    }
}
