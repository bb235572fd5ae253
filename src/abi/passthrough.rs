//! Every NCCL function we do not intercept or track: a pure forward to the real library.
//!
//! Pure means pure: these are also what NCCL's own internal calls reach when our library is
//! preloaded (libnccl calls about twenty of its exported names through the PLT), so they keep
//! no state and have no side effects beyond the NULL-output check. The exceptions, only for the
//! application's own calls: `ncclCommGetAsyncError` also tells the GPU engine what the
//! application read (see `intercept::engine::nccl_state_seen`), and in observe mode
//! `ncclReduceScatter` and `ncclAllGather` are timed (`intercept::engine::observed`).

#![allow(non_snake_case)]

use std::os::raw::{c_char, c_int, c_uint, c_void};

use crate::forward;
use crate::nccl::types::*;

/// Forwards to the real `ncclMemAlloc`.
#[no_mangle]
pub extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ResultCode {
    forward!(ncclMemAlloc(ptr, size); outputs ptr)
}

/// Forwards to the real `ncclMemFree`.
#[no_mangle]
pub extern "C" fn ncclMemFree(ptr: *mut c_void) -> ResultCode {
    forward!(ncclMemFree(ptr))
}

/// Forwards to the real `ncclGetVersion`.
#[no_mangle]
pub extern "C" fn ncclGetVersion(version: *mut c_int) -> ResultCode {
    forward!(ncclGetVersion(version); outputs version)
}

/// Forwards to the real `ncclGetUniqueId`.
#[no_mangle]
pub extern "C" fn ncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ResultCode {
    forward!(ncclGetUniqueId(uniqueId); outputs uniqueId)
}

/// Forwards to the real `ncclCommGetUniqueId`.
#[no_mangle]
pub extern "C" fn ncclCommGetUniqueId(comm: ncclComm_t, uniqueId: *mut ncclUniqueId) -> ResultCode {
    forward!(ncclCommGetUniqueId(comm, uniqueId); live comm; outputs uniqueId)
}

/// Forwards to the real `ncclResetDebugInit`.
#[no_mangle]
pub extern "C" fn ncclResetDebugInit() {
    forward!(ncclResetDebugInit())
}

/// Forwards to the real `ncclResetDebugInitInternal`: NCCL's own re-reading of `NCCL_DEBUG` and
/// its companions, exported by NCCL without a header or a `pnccl` twin; NCCL's tests and
/// tools call it.
#[no_mangle]
pub extern "C" fn ncclResetDebugInitInternal() {
    forward!(ncclResetDebugInitInternal())
}

/// Forwards to the real `ncclCommGetAsyncError`.
#[no_mangle]
pub extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    asyncError: *mut ResultCode,
) -> ResultCode {
    crate::abi::guard::guard("ncclCommGetAsyncError", || {
        let rc: ResultCode =
            forward!(ncclCommGetAsyncError(comm, asyncError); live comm; outputs asyncError);
        if rc == ResultCode::SUCCESS
            && crate::config::get().gpu_engine
            && !crate::nccl::reentry::inside_real_nccl()
        {
            // SAFETY: the forward above checked `asyncError` non-NULL and NCCL wrote it.
            crate::intercept::engine::nccl_state_seen(comm, unsafe { *asyncError });
        }
        // A kernel of the GPU engine that gave up makes the communicator's state an error too.
        if rc == ResultCode::SUCCESS && crate::config::get().gpu_engine {
            if let Some(code) = crate::intercept::engine::async_error(comm) {
                // SAFETY: the forward above checked `asyncError` non-NULL and NCCL wrote it.
                unsafe { *asyncError = code };
            }
        }
        rc
    })
}

/// Forwards to the real `ncclCommCount`.
#[no_mangle]
pub extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ResultCode {
    forward!(ncclCommCount(comm, count); live comm; outputs count)
}

/// Forwards to the real `ncclCommCuDevice`.
#[no_mangle]
pub extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ResultCode {
    forward!(ncclCommCuDevice(comm, device); live comm; outputs device)
}

/// Forwards to the real `ncclCommUserRank`.
#[no_mangle]
pub extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ResultCode {
    forward!(ncclCommUserRank(comm, rank); live comm; outputs rank)
}

/// Forwards to the real `ncclCommRegister`.
#[no_mangle]
pub extern "C" fn ncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ResultCode {
    forward!(ncclCommRegister(comm, buff, size, handle); live comm; outputs handle)
}

/// Forwards to the real `ncclCommDeregister`.
#[no_mangle]
pub extern "C" fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ResultCode {
    forward!(ncclCommDeregister(comm, handle); live comm)
}

/// Forwards to the real `ncclCommSuspend`.
#[no_mangle]
pub extern "C" fn ncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ResultCode {
    forward!(ncclCommSuspend(comm, flags); live comm)
}

/// Forwards to the real `ncclCommResume`.
#[no_mangle]
pub extern "C" fn ncclCommResume(comm: ncclComm_t) -> ResultCode {
    forward!(ncclCommResume(comm); live comm)
}

/// Forwards to the real `ncclCommMemStats`.
#[no_mangle]
pub extern "C" fn ncclCommMemStats(
    comm: ncclComm_t,
    stat: MemStatCode,
    value: *mut u64,
) -> ResultCode {
    forward!(ncclCommMemStats(comm, stat, value); live comm; outputs value)
}

/// Forwards to the real `ncclCommWindowRegister`.
#[no_mangle]
pub extern "C" fn ncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    winFlags: c_int,
) -> ResultCode {
    forward!(ncclCommWindowRegister(comm, buff, size, win, winFlags); live comm; outputs win)
}

/// Forwards to the real `ncclCommWindowDeregister`.
#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ResultCode {
    forward!(ncclCommWindowDeregister(comm, win); live comm)
}

/// Forwards to the real `ncclWinGetUserPtr`.
#[no_mangle]
pub extern "C" fn ncclWinGetUserPtr(
    comm: ncclComm_t,
    win: ncclWindow_t,
    outUserPtr: *mut *mut c_void,
) -> ResultCode {
    forward!(ncclWinGetUserPtr(comm, win, outUserPtr); live comm; outputs outUserPtr)
}

/// Forwards to the real `ncclReduce`.
#[no_mangle]
pub extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    op: RedOpCode,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclReduce(
        sendbuff, recvbuff, count, datatype, op, root, comm, stream
    ); live comm)
}

/// Forwards to the real `ncclBcast`.
#[no_mangle]
pub extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclBcast(buff, count, datatype, root, comm, stream); live comm)
}

/// Forwards to the real `ncclBroadcast`.
#[no_mangle]
pub extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclBroadcast(
        sendbuff, recvbuff, count, datatype, root, comm, stream
    ); live comm)
}

/// Forwards to the real `ncclReduceScatter`.
#[no_mangle]
pub extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: DataTypeCode,
    op: RedOpCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    // Timed in observe mode, by `recvcount` elements per rank.
    let collective = crate::intercept::engine::Collective::ReduceScatter;
    super::guard::guard("ncclReduceScatter", || {
        crate::intercept::engine::observed(collective, comm, stream, recvcount, datatype, || {
            forward!(ncclReduceScatter(
                sendbuff, recvbuff, recvcount, datatype, op, comm, stream
            ); live comm)
        })
    })
}

/// Forwards to the real `ncclAllGather`.
#[no_mangle]
pub extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: DataTypeCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    // Timed in observe mode, by `sendcount` elements per rank.
    let collective = crate::intercept::engine::Collective::AllGather;
    super::guard::guard("ncclAllGather", || {
        crate::intercept::engine::observed(collective, comm, stream, sendcount, datatype, || {
            forward!(ncclAllGather(
                sendbuff, recvbuff, sendcount, datatype, comm, stream
            ); live comm)
        })
    })
}

/// Forwards to the real `ncclAlltoAll`.
#[no_mangle]
pub extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclAlltoAll(
        sendbuff, recvbuff, count, datatype, comm, stream
    ); live comm)
}

/// Forwards to the real `ncclGather`.
#[no_mangle]
pub extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclGather(
        sendbuff, recvbuff, count, datatype, root, comm, stream
    ); live comm)
}

/// Forwards to the real `ncclScatter`.
#[no_mangle]
pub extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclScatter(
        sendbuff, recvbuff, count, datatype, root, comm, stream
    ); live comm)
}

/// Forwards to the real `ncclAllReduceConfig`.
#[no_mangle]
pub extern "C" fn ncclAllReduceConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    op: RedOpCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ResultCode {
    forward!(ncclAllReduceConfig(
        sendbuff, recvbuff, count, datatype, op, comm, stream, config
    ); live comm)
}

/// Forwards to the real `ncclBroadcastConfig`.
#[no_mangle]
pub extern "C" fn ncclBroadcastConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ResultCode {
    forward!(ncclBroadcastConfig(
        sendbuff, recvbuff, count, datatype, root, comm, stream, config
    ); live comm)
}

/// Forwards to the real `ncclReduceConfig`.
#[no_mangle]
pub extern "C" fn ncclReduceConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    op: RedOpCode,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ResultCode {
    forward!(ncclReduceConfig(
        sendbuff, recvbuff, count, datatype, op, root, comm, stream, config
    ); live comm)
}

/// Forwards to the real `ncclAllGatherConfig`.
#[no_mangle]
pub extern "C" fn ncclAllGatherConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: DataTypeCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ResultCode {
    forward!(ncclAllGatherConfig(
        sendbuff, recvbuff, sendcount, datatype, comm, stream, config
    ); live comm)
}

/// Forwards to the real `ncclReduceScatterConfig`.
#[no_mangle]
pub extern "C" fn ncclReduceScatterConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: DataTypeCode,
    op: RedOpCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ResultCode {
    forward!(ncclReduceScatterConfig(
        sendbuff, recvbuff, recvcount, datatype, op, comm, stream, config
    ); live comm)
}

/// Forwards to the real `ncclAlltoAllConfig`.
#[no_mangle]
pub extern "C" fn ncclAlltoAllConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ResultCode {
    forward!(ncclAlltoAllConfig(
        sendbuff, recvbuff, count, datatype, comm, stream, config
    ); live comm)
}

/// Forwards to the real `ncclGatherConfig`.
#[no_mangle]
pub extern "C" fn ncclGatherConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ResultCode {
    forward!(ncclGatherConfig(
        sendbuff, recvbuff, count, datatype, root, comm, stream, config
    ); live comm)
}

/// Forwards to the real `ncclScatterConfig`.
#[no_mangle]
pub extern "C" fn ncclScatterConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ResultCode {
    forward!(ncclScatterConfig(
        sendbuff, recvbuff, count, datatype, root, comm, stream, config
    ); live comm)
}

/// Forwards to the real `ncclSend`.
#[no_mangle]
pub extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: DataTypeCode,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclSend(sendbuff, count, datatype, peer, comm, stream); live comm)
}

/// Forwards to the real `ncclRecv`.
#[no_mangle]
pub extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclRecv(recvbuff, count, datatype, peer, comm, stream); live comm)
}

/// Forwards to the real `ncclPutSignal`.
#[no_mangle]
pub extern "C" fn ncclPutSignal(
    localbuff: *const c_void,
    count: usize,
    datatype: DataTypeCode,
    peer: c_int,
    peerWin: ncclWindow_t,
    peerWinOffset: usize,
    sigIdx: c_int,
    ctx: c_int,
    flags: c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclPutSignal(
        localbuff,
        count,
        datatype,
        peer,
        peerWin,
        peerWinOffset,
        sigIdx,
        ctx,
        flags,
        comm,
        stream
    ); live comm)
}

/// Forwards to the real `ncclSignal`.
#[no_mangle]
pub extern "C" fn ncclSignal(
    peer: c_int,
    sigIdx: c_int,
    ctx: c_int,
    flags: c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclSignal(peer, sigIdx, ctx, flags, comm, stream); live comm)
}

/// Forwards to the real `ncclWaitSignal`.
#[no_mangle]
pub extern "C" fn ncclWaitSignal(
    nDesc: c_int,
    signalDescs: *mut ncclWaitSignalDesc_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclWaitSignal(nDesc, signalDescs, comm, stream); live comm)
}

/// Forwards to the real `ncclGroupSimulateEnd`.
#[no_mangle]
pub extern "C" fn ncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ResultCode {
    forward!(ncclGroupSimulateEnd(simInfo))
}

/// Forwards to the real `ncclSetEncryption`.
#[no_mangle]
pub extern "C" fn ncclSetEncryption(config: *const ncclEncryptionConfig_t) -> ResultCode {
    forward!(ncclSetEncryption(config))
}

/// Forwards to the real `ncclParamBind`.
#[no_mangle]
pub extern "C" fn ncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) -> ResultCode {
    forward!(ncclParamBind(out, key); outputs out)
}

/// Forwards to the real `ncclParamGetI8`.
#[no_mangle]
pub extern "C" fn ncclParamGetI8(h: ncclParamHandle_t, out: *mut i8) -> ResultCode {
    forward!(ncclParamGetI8(h, out); outputs out)
}

/// Forwards to the real `ncclParamGetI16`.
#[no_mangle]
pub extern "C" fn ncclParamGetI16(h: ncclParamHandle_t, out: *mut i16) -> ResultCode {
    forward!(ncclParamGetI16(h, out); outputs out)
}

/// Forwards to the real `ncclParamGetI32`.
#[no_mangle]
pub extern "C" fn ncclParamGetI32(h: ncclParamHandle_t, out: *mut i32) -> ResultCode {
    forward!(ncclParamGetI32(h, out); outputs out)
}

/// Forwards to the real `ncclParamGetI64`.
#[no_mangle]
pub extern "C" fn ncclParamGetI64(h: ncclParamHandle_t, out: *mut i64) -> ResultCode {
    forward!(ncclParamGetI64(h, out); outputs out)
}

/// Forwards to the real `ncclParamGetU8`.
#[no_mangle]
pub extern "C" fn ncclParamGetU8(h: ncclParamHandle_t, out: *mut u8) -> ResultCode {
    forward!(ncclParamGetU8(h, out); outputs out)
}

/// Forwards to the real `ncclParamGetU16`.
#[no_mangle]
pub extern "C" fn ncclParamGetU16(h: ncclParamHandle_t, out: *mut u16) -> ResultCode {
    forward!(ncclParamGetU16(h, out); outputs out)
}

/// Forwards to the real `ncclParamGetU32`.
#[no_mangle]
pub extern "C" fn ncclParamGetU32(h: ncclParamHandle_t, out: *mut u32) -> ResultCode {
    forward!(ncclParamGetU32(h, out); outputs out)
}

/// Forwards to the real `ncclParamGetU64`.
#[no_mangle]
pub extern "C" fn ncclParamGetU64(h: ncclParamHandle_t, out: *mut u64) -> ResultCode {
    forward!(ncclParamGetU64(h, out); outputs out)
}

/// Forwards to the real `ncclParamGetStr`.
#[no_mangle]
pub extern "C" fn ncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) -> ResultCode {
    forward!(ncclParamGetStr(h, out); outputs out)
}

/// Forwards to the real `ncclParamGet`.
#[no_mangle]
pub extern "C" fn ncclParamGet(
    h: ncclParamHandle_t,
    out: *mut c_void,
    maxLen: c_int,
    len: *mut c_int,
) -> ResultCode {
    forward!(ncclParamGet(h, out, maxLen, len); outputs len)
}

/// Forwards to the real `ncclParamGetParameter`.
#[no_mangle]
pub extern "C" fn ncclParamGetParameter(
    key: *const c_char,
    value: *mut *const c_char,
    valueLen: *mut c_int,
) -> ResultCode {
    forward!(ncclParamGetParameter(key, value, valueLen); outputs value, valueLen)
}

/// Forwards to the real `ncclParamGetAllParameterKeys`.
#[no_mangle]
pub extern "C" fn ncclParamGetAllParameterKeys(
    table: *mut *mut *const c_char,
    tableLen: *mut c_int,
) -> ResultCode {
    forward!(ncclParamGetAllParameterKeys(table, tableLen); outputs table, tableLen)
}

/// Forwards to the real `ncclParamDumpAll`.
#[no_mangle]
pub extern "C" fn ncclParamDumpAll() {
    forward!(ncclParamDumpAll())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three identity queries refuse a NULL output alike, before reaching NCCL (the
    /// communicator here is a handle NCCL never made: only our checks can answer).
    #[test]
    fn identity_queries_refuse_a_null_output() {
        let comm = 0x7e57 as ncclComm_t;
        let null = std::ptr::null_mut();
        for rc in [
            ncclCommCount(comm, null),
            ncclCommCuDevice(comm, null),
            ncclCommUserRank(comm, null),
        ] {
            assert_eq!(rc, ResultCode::INVALID_ARGUMENT);
        }
    }
}
