//! Typed calls into the real NCCL for the library's own use (the GPU engine's setup exchange,
//! the calls its policy hands to NCCL, state queries), never through our exports: they reach
//! NCCL's own functions directly, inside the re-entry window (`reentry::calling_real`), so
//! nothing of ours intercepts or counts them.
//!
//! A communicator handle is opaque here, passed to NCCL as the application gave it: the safe
//! functions take it as NCCL's own safe-looking C API does, live by the caller's contract.

#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::c_void;

use super::reentry::calling_real;
use super::symbol::Symbol;
use super::types::{cudaStream_t, ncclComm_t, DataTypeCode, RedOpCode, ResultCode};

type AllGatherFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    DataTypeCode,
    ncclComm_t,
    cudaStream_t,
) -> ResultCode;

type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    DataTypeCode,
    RedOpCode,
    ncclComm_t,
    cudaStream_t,
) -> ResultCode;

type GetAsyncErrorFn = unsafe extern "C" fn(ncclComm_t, *mut ResultCode) -> ResultCode;

type CommIntFn = unsafe extern "C" fn(ncclComm_t, *mut std::os::raw::c_int) -> ResultCode;

static ALL_GATHER: Symbol = Symbol::new(c"pncclAllGather", c"ncclAllGather");
static ALL_REDUCE: Symbol = Symbol::new(c"pncclAllReduce", c"ncclAllReduce");
static GET_ASYNC_ERROR: Symbol = Symbol::new(c"pncclCommGetAsyncError", c"ncclCommGetAsyncError");
static COMM_COUNT: Symbol = Symbol::new(c"pncclCommCount", c"ncclCommCount");
static COMM_USER_RANK: Symbol = Symbol::new(c"pncclCommUserRank", c"ncclCommUserRank");
static COMM_CU_DEVICE: Symbol = Symbol::new(c"pncclCommCuDevice", c"ncclCommCuDevice");

/// `ncclAllGather` of `count` elements of `dtype` per rank on `stream`.
///
/// # Safety
/// NCCL's contract: `send` holds `count` elements and `recv` `count * nranks` elements of
/// `dtype` on the communicator's device, `comm` is live, `stream` is a stream of that device.
pub unsafe fn all_gather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: DataTypeCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    // SAFETY: ncclAllGather's C signature.
    match unsafe { ALL_GATHER.function::<AllGatherFn>() } {
        // SAFETY: as the caller vouches.
        Ok(real) => calling_real(|| unsafe { real(send, recv, count, dtype, comm, stream) }),
        Err(code) => code,
    }
}

/// `ncclAllReduce`, as NCCL runs it.
///
/// # Safety
/// NCCL's contract: both buffers hold `count` elements of `dtype` on the communicator's
/// device, `op` is valid on `comm`, `comm` is live, `stream` is a stream of that device.
#[allow(clippy::too_many_arguments)]
pub unsafe fn all_reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: DataTypeCode,
    op: RedOpCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    // SAFETY: ncclAllReduce's C signature.
    match unsafe { ALL_REDUCE.function::<AllReduceFn>() } {
        // SAFETY: as the caller vouches.
        Ok(real) => calling_real(|| unsafe { real(send, recv, count, dtype, op, comm, stream) }),
        Err(code) => code,
    }
}

/// The communicator's asynchronous state as NCCL reports it: `ncclSuccess`, `ncclInProgress`
/// or an error (also the code of a query that failed). `comm` must be live (not destroyed).
pub fn async_state(comm: ncclComm_t) -> ResultCode {
    if comm.is_null() {
        return ResultCode::INVALID_ARGUMENT;
    }
    // SAFETY: ncclCommGetAsyncError's C signature.
    let real = match unsafe { GET_ASYNC_ERROR.function::<GetAsyncErrorFn>() } {
        Ok(real) => real,
        Err(code) => return code,
    };
    let mut state = ResultCode::SUCCESS;
    // SAFETY: a live communicator (the caller's contract) and a valid out-pointer.
    let rc = calling_real(|| unsafe { real(comm, &mut state) });
    if rc == ResultCode::SUCCESS {
        state
    } else {
        rc
    }
}

/// What NCCL says of a live communicator: its size, this rank's index, its CUDA device (each
/// `None` where NCCL could not say, e.g. a nonblocking communicator still initialising).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Identity {
    pub nranks: Option<i32>,
    pub rank: Option<i32>,
    pub cuda_device: Option<i32>,
}

/// Asks NCCL for `comm`'s [`Identity`]. `comm` must be live (not destroyed).
pub fn identity(comm: ncclComm_t) -> Identity {
    let ask = |symbol: &Symbol| {
        if comm.is_null() {
            return None;
        }
        // SAFETY: ncclCommCount, ncclCommUserRank and ncclCommCuDevice share this signature.
        let real = unsafe { symbol.function::<CommIntFn>() }.ok()?;
        let mut value = -1;
        // SAFETY: a live communicator (the caller's contract) and a valid out-pointer.
        let rc = calling_real(|| unsafe { real(comm, &mut value) });
        rc.is_success().then_some(value)
    };
    Identity {
        nranks: ask(&COMM_COUNT),
        rank: ask(&COMM_USER_RANK),
        cuda_device: ask(&COMM_CU_DEVICE),
    }
}
