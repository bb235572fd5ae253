//! Our own C API, declared in `include/stragglar.h`.

#![allow(non_snake_case, non_camel_case_types)]

use std::ffi::CString;
use std::os::raw::{c_char, c_int};

use once_cell::sync::OnceCell;

use super::guard::guard;
use crate::nccl::types::ResultCode;
use crate::nccl::{binding, loader::FoundBy};

/// `STRAGGLAR_VERSION_CODE`: major * 10000 + minor * 100 + patch of this crate's version.
pub const STRAGGLAR_VERSION_CODE: c_int = decimal(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
    + decimal(env!("CARGO_PKG_VERSION_MINOR")) * 100
    + decimal(env!("CARGO_PKG_VERSION_PATCH"));

/// Parses a short decimal string at compile time.
const fn decimal(text: &str) -> c_int {
    let bytes = text.as_bytes();
    let mut value = 0;
    let mut i = 0;
    while i < bytes.len() {
        value = value * 10 + (bytes[i] - b'0') as c_int;
        i += 1;
    }
    value
}

/// Which real NCCL this process forwards to. Strings live as long as the process.
#[repr(C)]
pub struct stragglarNcclBinding_t {
    /// 1 when a real NCCL is bound, 0 when every NCCL call fails with `ncclSystemError`.
    pub bound: c_int,
    /// The bound library's `NCCL_VERSION_CODE`, or 0.
    pub ncclVersion: c_int,
    /// The bound library's path, or "".
    pub path: *const c_char,
    /// How it was found ("STRAGGLAR_NCCL_LIB", "already loaded", "search path"), or why none was.
    pub detail: *const c_char,
}

/// Writes `STRAGGLAR_VERSION_CODE` into `*version`.
#[no_mangle]
pub extern "C" fn stragglarGetVersion(version: *mut c_int) -> ResultCode {
    guard("stragglarGetVersion", || {
        if version.is_null() {
            return ResultCode::INVALID_ARGUMENT;
        }
        // SAFETY: checked non-NULL; the caller owns the int.
        unsafe { *version = STRAGGLAR_VERSION_CODE };
        ResultCode::SUCCESS
    })
}

struct BindingText {
    path: CString,
    detail: CString,
}

fn binding_text() -> &'static BindingText {
    static TEXT: OnceCell<BindingText> = OnceCell::new();
    TEXT.get_or_init(|| {
        let (path, detail) = match binding() {
            Ok(real) => (
                real.path.clone(),
                match real.found_by {
                    FoundBy::Environment => "STRAGGLAR_NCCL_LIB",
                    FoundBy::AlreadyLoaded => "already loaded",
                    FoundBy::SearchPath => "search path",
                }
                .to_string(),
            ),
            Err(e) => (String::new(), e.to_string()),
        };
        let c = |s: String| CString::new(s).unwrap_or_default();
        BindingText {
            path: c(path),
            detail: c(detail),
        }
    })
}

/// Says whether and where the real NCCL was bound (binding it first if nothing has yet).
/// Writes `*out` only on success.
#[no_mangle]
pub extern "C" fn stragglarGetNcclBinding(out: *mut stragglarNcclBinding_t) -> ResultCode {
    guard("stragglarGetNcclBinding", || {
        if out.is_null() {
            return ResultCode::INVALID_ARGUMENT;
        }
        let text = binding_text();
        let (bound, version) = match binding() {
            Ok(real) => (1, real.version.unwrap_or(0)),
            Err(_) => (0, 0),
        };
        let value = stragglarNcclBinding_t {
            bound,
            ncclVersion: version,
            path: text.path.as_ptr(),
            detail: text.detail.as_ptr(),
        };
        // SAFETY: checked non-NULL; the caller owns the struct.
        unsafe { out.write(value) };
        ResultCode::SUCCESS
    })
}
