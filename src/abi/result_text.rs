//! Our own text for each NCCL result code, for when no real NCCL is bound or an export fails
//! before reaching it.

use std::ffi::CStr;

use crate::nccl::types::ResultCode;

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
