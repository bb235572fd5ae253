//! Our own C API, declared in `include/stragglar.h`.

#![allow(non_snake_case, non_camel_case_types)]

use std::ffi::CString;
use std::os::raw::{c_char, c_int};

use once_cell::sync::OnceCell;

use super::guard::{check_live, guard, reject_null};
use crate::nccl::types::{ncclComm_t, ResultCode};
use crate::nccl::{binding, loader::FoundBy};
use crate::registry::fallback::Fallback;

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
            static WARNED: std::sync::atomic::AtomicBool =
                std::sync::atomic::AtomicBool::new(false);
            return reject_null(&WARNED, "stragglarGetVersion", "version");
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
            static WARNED: std::sync::atomic::AtomicBool =
                std::sync::atomic::AtomicBool::new(false);
            return reject_null(&WARNED, "stragglarGetNcclBinding", "out");
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

/// Entries of `stragglarStats_t::fallbacks`: one per cause that keeps an AllReduce on NCCL.
pub const STRAGGLAR_FALLBACK_COUNT: usize = 19;

const _: () = assert!(STRAGGLAR_FALLBACK_COUNT == Fallback::ALL.len());

/// What a communicator's `ncclAllReduce` calls did so far in this process.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct stragglarStats_t {
    /// Valid calls (refused ones are not counted).
    pub allReduceCalls: u64,
    /// Calls StragglAR ran.
    pub onStragglar: u64,
    /// Calls forwarded to NCCL.
    pub onNccl: u64,
    /// Forwarded calls by cause; `stragglarFallbackName(i)` names cause `i`.
    pub fallbacks: [u64; STRAGGLAR_FALLBACK_COUNT],
    /// The rank designated as the straggler by the last arrival record read (for that call's
    /// size class), or -1 for none (always -1 unless the GPU engine serves the communicator).
    pub designatedStraggler: c_int,
    pub reserved: c_int,
}

/// Copies the AllReduce counters of `comm` into `*stats` (zeros for a communicator that made
/// no call yet). `ncclInvalidArgument` for NULL arguments and destroyed communicators; writes
/// `*stats` only on success.
#[no_mangle]
pub extern "C" fn stragglarGetStats(comm: ncclComm_t, stats: *mut stragglarStats_t) -> ResultCode {
    guard("stragglarGetStats", || {
        static LIVE_WARNED: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        static NULL_WARNED: [std::sync::atomic::AtomicBool; 2] =
            [const { std::sync::atomic::AtomicBool::new(false) }; 2];
        if comm.is_null() {
            return reject_null(&NULL_WARNED[0], "stragglarGetStats", "comm");
        }
        if stats.is_null() {
            return reject_null(&NULL_WARNED[1], "stragglarGetStats", "stats");
        }
        if let Err(code) = check_live(comm, &LIVE_WARNED, "stragglarGetStats") {
            return code;
        }
        let s = crate::registry::comms().stats(comm).unwrap_or_default();
        let value = stragglarStats_t {
            allReduceCalls: s.calls,
            onStragglar: s.on_stragglar,
            onNccl: s.on_nccl(),
            fallbacks: s.fallbacks,
            designatedStraggler: crate::intercept::engine::designated(comm)
                .map_or(-1, |r| r as c_int),
            reserved: 0,
        };
        // SAFETY: checked non-NULL; the caller owns the struct.
        unsafe { stats.write(value) };
        ResultCode::SUCCESS
    })
}

/// One rank's arrivals on a communicator: a line of its straggler report, from the arrival
/// records every rank shares (kept by the GPU engine).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct stragglarArrivals_t {
    /// Calls whose arrival records were read.
    pub calls: u64,
    /// Of them, the calls where this rank arrived last.
    pub arrivedLast: u64,
    /// Its lead over the second-to-last arrival when it arrived last (the most recent 4096
    /// such calls), in microseconds: median and 90th percentile; 0 when it never did.
    pub medianLeadUs: f64,
    pub p90LeadUs: f64,
}

/// Copies rank `rank`'s arrivals on `comm` into `*arrivals`. `ncclInvalidArgument` for NULL
/// arguments, destroyed communicators and ranks outside the communicator; `ncclInvalidUsage`
/// when no arrival records are kept for `comm` (the GPU engine does not serve it);
/// `ncclInProgress` when a call of `comm` holds its state for over 10 ms (its host waiting for
/// its GPU): ask again. Writes `*arrivals` only on success.
#[no_mangle]
pub extern "C" fn stragglarGetArrivals(
    comm: ncclComm_t,
    rank: c_int,
    arrivals: *mut stragglarArrivals_t,
) -> ResultCode {
    guard("stragglarGetArrivals", || {
        static LIVE_WARNED: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        static UNSERVED_WARNED: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        static NULL_WARNED: [std::sync::atomic::AtomicBool; 2] =
            [const { std::sync::atomic::AtomicBool::new(false) }; 2];
        if comm.is_null() {
            return reject_null(&NULL_WARNED[0], "stragglarGetArrivals", "comm");
        }
        if arrivals.is_null() {
            return reject_null(&NULL_WARNED[1], "stragglarGetArrivals", "arrivals");
        }
        if let Err(code) = check_live(comm, &LIVE_WARNED, "stragglarGetArrivals") {
            return code;
        }
        use crate::intercept::engine::{arrivals as arrivals_of, NoArrivals};
        let nranks = crate::registry::comms().get(comm).and_then(|i| i.nranks);
        let Some(rank) = usize::try_from(rank)
            .ok()
            .filter(|&r| nranks.is_none_or(|n| r < n as usize))
        else {
            return ResultCode::INVALID_ARGUMENT;
        };
        let a = match arrivals_of(comm, rank) {
            Ok(a) => a,
            Err(NoArrivals::NoSuchRank) => return ResultCode::INVALID_ARGUMENT,
            Err(NoArrivals::Busy) => return ResultCode::IN_PROGRESS,
            Err(NoArrivals::Unserved) => {
                if !UNSERVED_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    log::warn!(
                        "stragglarGetArrivals: no arrival records for communicator {comm:p} (the GPU engine does not serve it); returning ncclInvalidUsage (logged once)"
                    );
                }
                return ResultCode::INVALID_USAGE;
            }
        };
        let us = |ns: Option<u64>| ns.map_or(0.0, |ns| ns as f64 / 1e3);
        let value = stragglarArrivals_t {
            calls: a.calls,
            arrivedLast: a.arrived_last,
            medianLeadUs: us(a.median_lead_ns),
            p90LeadUs: us(a.p90_lead_ns),
        };
        // SAFETY: checked non-NULL; the caller owns the struct.
        unsafe { arrivals.write(value) };
        ResultCode::SUCCESS
    })
}

/// The policy's view of one size class of a communicator's AllReduce calls (calls of
/// `2^(c-1)` to `2^c - 1` bytes form class `c`), kept by the GPU engine.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct stragglarSizeClass_t {
    /// Calls of the class the policy decided (every call the engine took outside graph
    /// capture).
    pub calls: u64,
    /// Of them, the calls that ran StragglAR (the others went to NCCL).
    pub onStragglar: u64,
    /// Median post-arrival time of the class's recent StragglAR calls at its current pipeline
    /// depth (`STRAGGLAR_PIPELINE=auto` refines it by measurement), in microseconds (from
    /// the last rank's arrival to that rank's finish, measured on its GPU); 0 before any.
    pub stragglarPostUs: f64,
    /// Post-arrival times of StragglAR calls measured so far at that depth.
    pub stragglarSamples: u64,
    /// The same for the calls NCCL ran.
    pub ncclPostUs: f64,
    pub ncclSamples: u64,
}

/// Copies what the policy measured and chose for size class `sizeClass` (0 to 64) of `comm`
/// into `*out` (zeros for a class without calls). `ncclInvalidArgument` for NULL arguments,
/// destroyed communicators and classes outside 0..=64; `ncclInvalidUsage` when the GPU engine
/// does not serve `comm`; `ncclInProgress` when a call of `comm` holds its state for over
/// 10 ms: ask again. Writes `*out` only on success.
#[no_mangle]
pub extern "C" fn stragglarGetSizeClass(
    comm: ncclComm_t,
    sizeClass: c_int,
    out: *mut stragglarSizeClass_t,
) -> ResultCode {
    guard("stragglarGetSizeClass", || {
        static LIVE_WARNED: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        static UNSERVED_WARNED: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        static NULL_WARNED: [std::sync::atomic::AtomicBool; 2] =
            [const { std::sync::atomic::AtomicBool::new(false) }; 2];
        if comm.is_null() {
            return reject_null(&NULL_WARNED[0], "stragglarGetSizeClass", "comm");
        }
        if out.is_null() {
            return reject_null(&NULL_WARNED[1], "stragglarGetSizeClass", "out");
        }
        if let Err(code) = check_live(comm, &LIVE_WARNED, "stragglarGetSizeClass") {
            return code;
        }
        let Some(class) = u32::try_from(sizeClass).ok().filter(|&c| c <= usize::BITS) else {
            log::warn!(
                "stragglarGetSizeClass: size class {sizeClass} is outside 0..={}; returning ncclInvalidArgument",
                usize::BITS
            );
            return ResultCode::INVALID_ARGUMENT;
        };
        use crate::intercept::engine::{class_times, NoArrivals};
        let times = match class_times(comm, class) {
            Ok(times) => times.unwrap_or_default(),
            Err(NoArrivals::Busy) => return ResultCode::IN_PROGRESS,
            Err(_) => {
                if !UNSERVED_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    log::warn!(
                        "stragglarGetSizeClass: no measurements for communicator {comm:p} (the GPU engine does not serve it); returning ncclInvalidUsage (logged once)"
                    );
                }
                return ResultCode::INVALID_USAGE;
            }
        };
        let us = |ns: Option<u64>| ns.map_or(0.0, |ns| ns as f64 / 1e3);
        let value = stragglarSizeClass_t {
            calls: times.decided,
            onStragglar: times.on_stragglar,
            stragglarPostUs: us(times.stragglar.median()),
            stragglarSamples: times.stragglar.taken(),
            ncclPostUs: us(times.baseline.median()),
            ncclSamples: times.baseline.taken(),
        };
        // SAFETY: checked non-NULL; the caller owns the struct.
        unsafe { out.write(value) };
        ResultCode::SUCCESS
    })
}

/// The name of fallback cause `index` (`"too-few-ranks"`, ...), or `"unknown"`. The string is
/// static.
#[no_mangle]
pub extern "C" fn stragglarFallbackName(index: c_int) -> *const c_char {
    guard("stragglarFallbackName", || {
        static NAMES: OnceCell<Vec<CString>> = OnceCell::new();
        let names = NAMES.get_or_init(|| {
            Fallback::ALL
                .iter()
                .map(|f| CString::new(f.name()).expect("names have no NUL"))
                .collect()
        });
        usize::try_from(index)
            .ok()
            .and_then(|i| names.get(i))
            .map_or(c"unknown".as_ptr(), |n| n.as_ptr())
    })
}
