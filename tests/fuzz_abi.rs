//! A seeded random driver of the C ABI with hostile arguments, from several threads at once,
//! against the real NCCL (when the test environment names it): NULL outputs and buffers,
//! values outside every enum, counts of 0, 1 and SIZE_MAX, misaligned buffers, NULL and
//! destroyed communicators, unbalanced groups. Expected: an NCCL error code (never a crash, a
//! panic escaping, a hang or a written output), at most one log line per cause, and no memory
//! growth.

mod support;

use std::ffi::c_void;
use std::os::raw::c_int;

use stragglar::abi::allreduce::ncclAllReduce;
use stragglar::abi::errors::{ncclGetErrorString, ncclGetLastError};
use stragglar::abi::groups::{ncclGroupEnd, ncclGroupStart};
use stragglar::abi::lifecycle::{
    ncclCommAbort, ncclCommDestroy, ncclCommFinalize, ncclCommInitRank, ncclCommSplit,
};
use stragglar::abi::passthrough::*;
use stragglar::abi::redops::{ncclRedOpCreatePreMulSum, ncclRedOpDestroy};
use stragglar::nccl::types::*;
use stragglar::registry::groups;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize]
    }
}

const DEAD: usize = 0xdead_0000;

fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// One hostile call; returns a description when an expectation fails.
fn hostile_call(rng: &mut Rng, buf: &mut [u8; 64]) -> Option<String> {
    let comm = rng.pick(&[std::ptr::null_mut(), DEAD as ncclComm_t]);
    let dtype = DataTypeCode(rng.pick(&[-1, 0, 7, 11, 12, 99, i32::MIN, i32::MAX]));
    let op = RedOpCode(rng.pick(&[-1, 0, 4, 5, 1234, i32::MIN, i32::MAX]));
    let count = rng.pick(&[0usize, 1, 3, usize::MAX, usize::MAX / 2]);
    let base = buf.as_mut_ptr();
    let ptr = rng.pick(&[
        std::ptr::null_mut(),
        base as *mut c_void,
        base.wrapping_add(1) as *mut c_void,
    ]);
    let stream: cudaStream_t = std::ptr::null_mut();
    let must_fail = |name: &str, rc: ResultCode| {
        (rc == ResultCode::SUCCESS).then(|| format!("{name} succeeded on comm {comm:p}"))
    };
    match rng.next() % 16 {
        0 => {
            let mut n: c_int = -77;
            let rc = ncclCommCount(
                comm,
                if rng.next() % 2 == 0 {
                    &mut n
                } else {
                    std::ptr::null_mut()
                },
            );
            (n != -77)
                .then(|| format!("ncclCommCount wrote an output on failure ({rc:?})"))
                .or(must_fail("ncclCommCount", rc))
        }
        1 => must_fail(
            "ncclCommCuDevice",
            ncclCommCuDevice(comm, std::ptr::null_mut()),
        ),
        2 => {
            let mut e = ResultCode(-5);
            must_fail("ncclCommGetAsyncError", ncclCommGetAsyncError(comm, &mut e))
        }
        3 => must_fail(
            "ncclAllReduce",
            ncclAllReduce(ptr, ptr, count, dtype, op, comm, stream),
        ),
        4 => must_fail(
            "ncclBroadcast",
            ncclBroadcast(ptr, ptr, count, dtype, rng.pick(&[-1, 0, 9]), comm, stream),
        ),
        5 => must_fail(
            "ncclReduce",
            ncclReduce(ptr, ptr, count, dtype, op, 0, comm, stream),
        ),
        6 => must_fail(
            "ncclAllGather",
            ncclAllGather(ptr, ptr, count, dtype, comm, stream),
        ),
        7 => must_fail(
            "ncclSend",
            ncclSend(ptr, count, dtype, rng.pick(&[-1, 0, 1 << 20]), comm, stream),
        ),
        8 => {
            let mut created = RedOpCode(-9);
            let mut scalar = 2.0f64;
            let rc = ncclRedOpCreatePreMulSum(
                if rng.next() % 2 == 0 {
                    &mut created
                } else {
                    std::ptr::null_mut()
                },
                if rng.next() % 2 == 0 {
                    (&mut scalar) as *mut f64 as *mut c_void
                } else {
                    std::ptr::null_mut()
                },
                dtype,
                ScalarResidenceCode(rng.pick(&[-1, 0, 1, 7])),
                comm,
            );
            must_fail("ncclRedOpCreatePreMulSum", rc)
        }
        9 => must_fail("ncclRedOpDestroy", ncclRedOpDestroy(op, comm)),
        10 => {
            if rng.next() % 2 == 0 {
                let _ = ncclGroupStart();
            } else {
                let _ = ncclGroupEnd();
            }
            None
        }
        11 => {
            let text = ncclGetErrorString(ResultCode(rng.pick(&[-1, 0, 8, 9, 1000, i32::MIN])));
            text.is_null()
                .then(|| "ncclGetErrorString returned NULL".to_string())
        }
        12 => ncclGetLastError(comm)
            .is_null()
            .then(|| "ncclGetLastError returned NULL".to_string()),
        13 => {
            let rc = if rng.next() % 2 == 0 {
                ncclCommDestroy(comm)
            } else {
                ncclCommAbort(comm)
            };
            (comm as usize == DEAD && rc != ResultCode::INVALID_ARGUMENT)
                .then(|| format!("a destroyed comm was torn down again: {rc:?}"))
        }
        14 => {
            let mut new_comm: ncclComm_t = 0x5 as ncclComm_t;
            let rc = ncclCommSplit(
                comm,
                rng.pick(&[-1, 0, 3]),
                0,
                &mut new_comm,
                std::ptr::null_mut(),
            );
            (new_comm as usize != 0x5 && rc != ResultCode::SUCCESS)
                .then(|| format!("ncclCommSplit wrote its output on failure ({rc:?})"))
                .or(must_fail("ncclCommSplit", rc))
        }
        _ => must_fail("ncclCommFinalize", ncclCommFinalize(comm)),
    }
}

#[test]
fn hostile_arguments_from_many_threads_get_error_codes() {
    let log = support::fuzz_setup("fuzz", false, DEAD);
    let mut id = ncclUniqueId { internal: [0; 128] };
    let _ = ncclGetUniqueId(&mut id);
    let mut comm: ncclComm_t = std::ptr::null_mut();
    for (nranks, rank) in [(-1, 0), (0, 0), (2, 5), (i32::MAX, 0)] {
        let rc = ncclCommInitRank(&mut comm, nranks, id, rank);
        assert_ne!(rc, ResultCode::SUCCESS, "init without a GPU cannot succeed");
        assert!(comm.is_null(), "no communicator written on failure");
    }
    let warm = resident_bytes();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = Rng(0x5eed_0000 + t * 7919 + 1);
                let mut buf = [0u8; 64];
                let mut failures = Vec::new();
                for _ in 0..3000 {
                    if let Some(f) = hostile_call(&mut rng, &mut buf) {
                        failures.push(f);
                    }
                }
                while groups::depth() > 0 {
                    let _ = ncclGroupEnd();
                }
                failures
            })
        })
        .collect();
    let failures: Vec<String> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("no panic escapes"))
        .collect();
    assert!(
        failures.is_empty(),
        "{} expectations failed, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let grown = resident_bytes().saturating_sub(warm);
    assert!(
        grown < 64 << 20,
        "resident memory grew by {grown} bytes over 12000 calls"
    );
    let lines = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .count();
    let _ = std::fs::remove_file(&log);
    assert!(
        lines <= 100,
        "{lines} log lines for 12000 calls: not one per cause"
    );
}
