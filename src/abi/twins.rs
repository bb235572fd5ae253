//! The profiling twins `pncclX` of every function in `nccl.h`. NCCL exports both names; tools
//! that define `ncclX` themselves call `pncclX` to reach the library. Ours forward to the real
//! `pncclX` and are never intercepted (`pncclAllReduce` always reaches NCCL). Like their
//! `ncclX`, they refuse NULL and destroyed communicators (NCCL would dereference them), and
//! `pncclCommDestroy`/`pncclCommAbort` record the destruction.

#![allow(non_snake_case)]

use std::os::raw::{c_char, c_int, c_uint, c_void};

use super::allreduce::ncclAllReduce;
use super::errors::{ncclGetErrorString, ncclGetLastError};
use super::groups::{ncclGroupEnd, ncclGroupStart};
use super::lifecycle::*;
use super::passthrough::*;
use super::redops::{ncclRedOpCreatePreMulSum, ncclRedOpDestroy};
use crate::forward;
use crate::nccl::types::*;

/// Forwards to the real `pncclMemAlloc`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ResultCode {
    forward!(ncclMemAlloc(ptr, size); outputs ptr)
}

/// Forwards to the real `pncclMemFree`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclMemFree(ptr: *mut c_void) -> ResultCode {
    forward!(ncclMemFree(ptr))
}

/// Forwards to the real `pncclGetVersion`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclGetVersion(version: *mut c_int) -> ResultCode {
    forward!(ncclGetVersion(version); outputs version)
}

/// Forwards to the real `pncclGetUniqueId`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ResultCode {
    forward!(ncclGetUniqueId(uniqueId); outputs uniqueId)
}

/// Forwards to the real `pncclCommInitRankConfig`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ResultCode {
    forward!(ncclCommInitRankConfig(comm, nranks, commId, rank, config))
}

/// Forwards to the real `pncclCommInitRank`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ResultCode {
    forward!(ncclCommInitRank(comm, nranks, commId, rank))
}

/// Forwards to the real `pncclCommInitAll`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommInitAll(
    comm: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ResultCode {
    forward!(ncclCommInitAll(comm, ndev, devlist))
}

/// Forwards to the real `pncclCommFinalize`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommFinalize(comm: ncclComm_t) -> ResultCode {
    forward!(ncclCommFinalize(comm); live comm)
}

/// Forwards to the real `pncclCommDestroy`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommDestroy(comm: ncclComm_t) -> ResultCode {
    // Tracked like ncclCommDestroy, so later calls on the handle are refused whichever name
    // destroyed it.
    ncclCommDestroy(comm)
}

/// Forwards to the real `pncclCommAbort`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommAbort(comm: ncclComm_t) -> ResultCode {
    // Tracked like ncclCommAbort (see pncclCommDestroy).
    ncclCommAbort(comm)
}

/// Forwards to the real `pncclCommRevoke`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ResultCode {
    forward!(ncclCommRevoke(comm, revokeFlags); live comm)
}

/// Forwards to the real `pncclCommSplit`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ResultCode {
    forward!(ncclCommSplit(comm, color, key, newcomm, config); live comm; outputs newcomm)
}

/// Forwards to the real `pncclCommShrink`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommShrink(
    comm: ncclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrinkFlags: c_int,
) -> ResultCode {
    forward!(ncclCommShrink(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags); live comm; outputs newcomm)
}

/// Forwards to the real `pncclCommGetUniqueId`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommGetUniqueId(
    comm: ncclComm_t,
    uniqueId: *mut ncclUniqueId,
) -> ResultCode {
    forward!(ncclCommGetUniqueId(comm, uniqueId); live comm; outputs uniqueId)
}

/// Forwards to the real `pncclCommGrow`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommGrow(
    comm: ncclComm_t,
    nRanks: c_int,
    uniqueId: *const ncclUniqueId,
    rank: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ResultCode {
    forward!(ncclCommGrow(comm, nRanks, uniqueId, rank, newcomm, config); live comm; outputs newcomm)
}

/// Forwards to the real `pncclCommInitRankScalable`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ResultCode {
    forward!(ncclCommInitRankScalable(newcomm, nranks, myrank, nId, commIds, config); outputs newcomm)
}

/// Forwards to the real `pncclGetErrorString`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclGetErrorString(result: ResultCode) -> *const c_char {
    forward!(ncclGetErrorString(result))
}

/// Forwards to the real `pncclGetLastError`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclGetLastError(comm: ncclComm_t) -> *const c_char {
    forward!(ncclGetLastError(comm); live comm)
}

/// Forwards to the real `pncclResetDebugInit`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclResetDebugInit() {
    forward!(ncclResetDebugInit())
}

/// Forwards to the real `pncclCommGetAsyncError`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommGetAsyncError(
    comm: ncclComm_t,
    asyncError: *mut ResultCode,
) -> ResultCode {
    forward!(ncclCommGetAsyncError(comm, asyncError); live comm; outputs asyncError)
}

/// Forwards to the real `pncclCommCount`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ResultCode {
    forward!(ncclCommCount(comm, count); live comm; outputs count)
}

/// Forwards to the real `pncclCommCuDevice`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ResultCode {
    forward!(ncclCommCuDevice(comm, device); live comm; outputs device)
}

/// Forwards to the real `pncclCommUserRank`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ResultCode {
    forward!(ncclCommUserRank(comm, rank); live comm)
}

/// Forwards to the real `pncclCommRegister`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ResultCode {
    forward!(ncclCommRegister(comm, buff, size, handle); live comm; outputs handle)
}

/// Forwards to the real `pncclCommDeregister`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ResultCode {
    forward!(ncclCommDeregister(comm, handle); live comm)
}

/// Forwards to the real `pncclCommSuspend`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ResultCode {
    forward!(ncclCommSuspend(comm, flags); live comm)
}

/// Forwards to the real `pncclCommResume`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommResume(comm: ncclComm_t) -> ResultCode {
    forward!(ncclCommResume(comm); live comm)
}

/// Forwards to the real `pncclCommMemStats`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommMemStats(
    comm: ncclComm_t,
    stat: MemStatCode,
    value: *mut u64,
) -> ResultCode {
    forward!(ncclCommMemStats(comm, stat, value); live comm; outputs value)
}

/// Forwards to the real `pncclCommWindowRegister`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    winFlags: c_int,
) -> ResultCode {
    forward!(ncclCommWindowRegister(comm, buff, size, win, winFlags); live comm; outputs win)
}

/// Forwards to the real `pncclCommWindowDeregister`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ResultCode {
    forward!(ncclCommWindowDeregister(comm, win); live comm)
}

/// Forwards to the real `pncclWinGetUserPtr`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclWinGetUserPtr(
    comm: ncclComm_t,
    win: ncclWindow_t,
    outUserPtr: *mut *mut c_void,
) -> ResultCode {
    forward!(ncclWinGetUserPtr(comm, win, outUserPtr); live comm; outputs outUserPtr)
}

/// Forwards to the real `pncclRedOpCreatePreMulSum`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclRedOpCreatePreMulSum(
    op: *mut RedOpCode,
    scalar: *mut c_void,
    datatype: DataTypeCode,
    residence: ScalarResidenceCode,
    comm: ncclComm_t,
) -> ResultCode {
    forward!(ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm); live comm; outputs op)
}

/// Forwards to the real `pncclRedOpDestroy`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclRedOpDestroy(op: RedOpCode, comm: ncclComm_t) -> ResultCode {
    forward!(ncclRedOpDestroy(op, comm); live comm)
}

/// Forwards to the real `pncclReduce`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclReduce(
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

/// Forwards to the real `pncclBcast`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclBcast(buff, count, datatype, root, comm, stream); live comm)
}

/// Forwards to the real `pncclBroadcast`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclBroadcast(
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

/// Forwards to the real `pncclAllReduce`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    op: RedOpCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclAllReduce(
        sendbuff, recvbuff, count, datatype, op, comm, stream
    ); live comm)
}

/// Forwards to the real `pncclReduceScatter`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: DataTypeCode,
    op: RedOpCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclReduceScatter(
        sendbuff, recvbuff, recvcount, datatype, op, comm, stream
    ); live comm)
}

/// Forwards to the real `pncclAllGather`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: DataTypeCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclAllGather(
        sendbuff, recvbuff, sendcount, datatype, comm, stream
    ); live comm)
}

/// Forwards to the real `pncclAlltoAll`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclAlltoAll(
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

/// Forwards to the real `pncclGather`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclGather(
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

/// Forwards to the real `pncclScatter`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclScatter(
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

/// Forwards to the real `pncclAllReduceConfig`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclAllReduceConfig(
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

/// Forwards to the real `pncclBroadcastConfig`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclBroadcastConfig(
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

/// Forwards to the real `pncclReduceConfig`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclReduceConfig(
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

/// Forwards to the real `pncclAllGatherConfig`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclAllGatherConfig(
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

/// Forwards to the real `pncclReduceScatterConfig`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclReduceScatterConfig(
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

/// Forwards to the real `pncclAlltoAllConfig`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclAlltoAllConfig(
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

/// Forwards to the real `pncclGatherConfig`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclGatherConfig(
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

/// Forwards to the real `pncclScatterConfig`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclScatterConfig(
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

/// Forwards to the real `pncclSend`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: DataTypeCode,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclSend(sendbuff, count, datatype, peer, comm, stream); live comm)
}

/// Forwards to the real `pncclRecv`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclRecv(recvbuff, count, datatype, peer, comm, stream); live comm)
}

/// Forwards to the real `pncclPutSignal`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclPutSignal(
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

/// Forwards to the real `pncclSignal`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclSignal(
    peer: c_int,
    sigIdx: c_int,
    ctx: c_int,
    flags: c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclSignal(peer, sigIdx, ctx, flags, comm, stream); live comm)
}

/// Forwards to the real `pncclWaitSignal`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclWaitSignal(
    nDesc: c_int,
    signalDescs: *mut ncclWaitSignalDesc_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    forward!(ncclWaitSignal(nDesc, signalDescs, comm, stream); live comm)
}

/// Forwards to the real `pncclGroupStart`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclGroupStart() -> ResultCode {
    forward!(ncclGroupStart())
}

/// Forwards to the real `pncclGroupEnd`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclGroupEnd() -> ResultCode {
    forward!(ncclGroupEnd())
}

/// Forwards to the real `pncclGroupSimulateEnd`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ResultCode {
    forward!(ncclGroupSimulateEnd(simInfo))
}

/// Forwards to the real `pncclSetEncryption`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclSetEncryption(config: *const ncclEncryptionConfig_t) -> ResultCode {
    forward!(ncclSetEncryption(config))
}

/// Forwards to the real `pncclParamBind`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) -> ResultCode {
    forward!(ncclParamBind(out, key); outputs out)
}

/// Forwards to the real `pncclParamGetI8`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamGetI8(h: ncclParamHandle_t, out: *mut i8) -> ResultCode {
    forward!(ncclParamGetI8(h, out); outputs out)
}

/// Forwards to the real `pncclParamGetI16`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamGetI16(h: ncclParamHandle_t, out: *mut i16) -> ResultCode {
    forward!(ncclParamGetI16(h, out); outputs out)
}

/// Forwards to the real `pncclParamGetI32`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamGetI32(h: ncclParamHandle_t, out: *mut i32) -> ResultCode {
    forward!(ncclParamGetI32(h, out); outputs out)
}

/// Forwards to the real `pncclParamGetI64`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamGetI64(h: ncclParamHandle_t, out: *mut i64) -> ResultCode {
    forward!(ncclParamGetI64(h, out); outputs out)
}

/// Forwards to the real `pncclParamGetU8`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamGetU8(h: ncclParamHandle_t, out: *mut u8) -> ResultCode {
    forward!(ncclParamGetU8(h, out); outputs out)
}

/// Forwards to the real `pncclParamGetU16`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamGetU16(h: ncclParamHandle_t, out: *mut u16) -> ResultCode {
    forward!(ncclParamGetU16(h, out); outputs out)
}

/// Forwards to the real `pncclParamGetU32`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamGetU32(h: ncclParamHandle_t, out: *mut u32) -> ResultCode {
    forward!(ncclParamGetU32(h, out); outputs out)
}

/// Forwards to the real `pncclParamGetU64`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamGetU64(h: ncclParamHandle_t, out: *mut u64) -> ResultCode {
    forward!(ncclParamGetU64(h, out); outputs out)
}

/// Forwards to the real `pncclParamGetStr`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) -> ResultCode {
    forward!(ncclParamGetStr(h, out); outputs out)
}

/// Forwards to the real `pncclParamGet`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamGet(
    h: ncclParamHandle_t,
    out: *mut c_void,
    maxLen: c_int,
    len: *mut c_int,
) -> ResultCode {
    forward!(ncclParamGet(h, out, maxLen, len); outputs len)
}

/// Forwards to the real `pncclParamGetParameter`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamGetParameter(
    key: *const c_char,
    value: *mut *const c_char,
    valueLen: *mut c_int,
) -> ResultCode {
    forward!(ncclParamGetParameter(key, value, valueLen); outputs value, valueLen)
}

/// Forwards to the real `pncclParamGetAllParameterKeys`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamGetAllParameterKeys(
    table: *mut *mut *const c_char,
    tableLen: *mut c_int,
) -> ResultCode {
    forward!(ncclParamGetAllParameterKeys(table, tableLen); outputs table, tableLen)
}

/// Forwards to the real `pncclParamDumpAll`; never intercepted.
#[no_mangle]
pub extern "C" fn pncclParamDumpAll() {
    forward!(ncclParamDumpAll())
}
