//! Host functions of NCCL's device API (2.28+; declared in `nccl_device/host.h`, not in
//! `nccl.h`): pure forwards (their twins are generated into `device_twins.rs`). Their structs are passed by pointer only, except
//! the 12-byte `ncclTeam_t` and the one-pointer `ncclMultimemHandle_t`, which we mirror.

#![allow(non_snake_case)]

use std::os::raw::{c_int, c_void};

use crate::forward;
use crate::nccl::types::*;

/// Forwards to the real `ncclCommQueryProperties` (device API).
#[no_mangle]
pub extern "C" fn ncclCommQueryProperties(
    comm: ncclComm_t,
    props: *mut DeviceApiOpaque,
) -> ResultCode {
    forward!(ncclCommQueryProperties(comm, props); live comm; outputs props)
}

/// Forwards to the real `ncclDevCommCreate` (device API).
#[no_mangle]
pub extern "C" fn ncclDevCommCreate(
    comm: ncclComm_t,
    reqs: *const DeviceApiOpaque,
    outDevComm: *mut DeviceApiOpaque,
) -> ResultCode {
    forward!(ncclDevCommCreate(comm, reqs, outDevComm); live comm; outputs outDevComm)
}

/// Forwards to the real `ncclDevCommDestroy` (device API).
#[no_mangle]
pub extern "C" fn ncclDevCommDestroy(
    comm: ncclComm_t,
    devComm: *const DeviceApiOpaque,
) -> ResultCode {
    forward!(ncclDevCommDestroy(comm, devComm); live comm)
}

/// Forwards to the real `ncclGetLsaMultimemDevicePointer` (device API).
#[no_mangle]
pub extern "C" fn ncclGetLsaMultimemDevicePointer(
    window: ncclWindow_t,
    offset: usize,
    outPtr: *mut *mut c_void,
) -> ResultCode {
    forward!(ncclGetLsaMultimemDevicePointer(window, offset, outPtr); outputs outPtr)
}

/// Forwards to the real `ncclGetMultimemDevicePointer` (device API).
#[no_mangle]
pub extern "C" fn ncclGetMultimemDevicePointer(
    window: ncclWindow_t,
    offset: usize,
    multimem: ncclMultimemHandle_t,
    outPtr: *mut *mut c_void,
) -> ResultCode {
    forward!(ncclGetMultimemDevicePointer(window, offset, multimem, outPtr); outputs outPtr)
}

/// Forwards to the real `ncclGetLsaDevicePointer` (device API).
#[no_mangle]
pub extern "C" fn ncclGetLsaDevicePointer(
    window: ncclWindow_t,
    offset: usize,
    lsaRank: c_int,
    outPtr: *mut *mut c_void,
) -> ResultCode {
    forward!(ncclGetLsaDevicePointer(window, offset, lsaRank, outPtr); outputs outPtr)
}

/// Forwards to the real `ncclGetPeerDevicePointer` (device API).
#[no_mangle]
pub extern "C" fn ncclGetPeerDevicePointer(
    window: ncclWindow_t,
    offset: usize,
    peer: c_int,
    outPtr: *mut *mut c_void,
) -> ResultCode {
    forward!(ncclGetPeerDevicePointer(window, offset, peer, outPtr); outputs outPtr)
}

/// Forwards to the real `ncclGetMultimemDeviceLeInfo` (device API).
#[no_mangle]
pub extern "C" fn ncclGetMultimemDeviceLeInfo(
    window: ncclWindow_t,
    offset: usize,
    leId: *mut u32,
    leOffset: *mut usize,
) -> ResultCode {
    forward!(ncclGetMultimemDeviceLeInfo(window, offset, leId, leOffset); outputs leId, leOffset)
}

/// Forwards to the real `ncclGetCftDeviceLeInfo` (device API).
#[no_mangle]
pub extern "C" fn ncclGetCftDeviceLeInfo(
    window: ncclWindow_t,
    offset: usize,
    peerCft: c_int,
    cftTeam: ncclTeam_t,
    leId: *mut u32,
    leOffset: *mut usize,
) -> ResultCode {
    forward!(ncclGetCftDeviceLeInfo(window, offset, peerCft, cftTeam, leId, leOffset); team cftTeam; outputs leId, leOffset)
}

/// Forwards to the real `ncclGetPeerDeviceLeInfo` (device API).
#[no_mangle]
pub extern "C" fn ncclGetPeerDeviceLeInfo(
    window: ncclWindow_t,
    offset: usize,
    peerWorld: c_int,
    leId: *mut u32,
    leOffset: *mut usize,
) -> ResultCode {
    forward!(ncclGetPeerDeviceLeInfo(window, offset, peerWorld, leId, leOffset); outputs leId, leOffset)
}

/// Forwards to the real `ncclTeamWorld` (device API).
#[no_mangle]
pub extern "C" fn ncclTeamWorld(comm: ncclComm_t) -> ncclTeam_t {
    forward!(ncclTeamWorld(comm); live comm)
}

/// Forwards to the real `ncclTeamLsa` (device API).
#[no_mangle]
pub extern "C" fn ncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t {
    forward!(ncclTeamLsa(comm); live comm)
}

/// Forwards to the real `ncclTeamCft` (device API).
#[no_mangle]
pub extern "C" fn ncclTeamCft(comm: ncclComm_t, mode: c_int) -> ncclTeam_t {
    forward!(ncclTeamCft(comm, mode); live comm)
}

/// Forwards to the real `ncclTeamCftMultimem` (device API).
#[no_mangle]
pub extern "C" fn ncclTeamCftMultimem(comm: ncclComm_t) -> ncclTeam_t {
    forward!(ncclTeamCftMultimem(comm); live comm)
}

/// Forwards to the real `ncclTeamRankToWorld` (device API).
#[no_mangle]
pub extern "C" fn ncclTeamRankToWorld(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
    forward!(ncclTeamRankToWorld(comm, team, rank); live comm; team team)
}

/// Forwards to the real `ncclTeamRankToLsa` (device API).
#[no_mangle]
pub extern "C" fn ncclTeamRankToLsa(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
    forward!(ncclTeamRankToLsa(comm, team, rank); live comm; team team)
}

/// Forwards to the real `ncclTeamRail` (device API).
#[no_mangle]
pub extern "C" fn ncclTeamRail(comm: ncclComm_t) -> ncclTeam_t {
    forward!(ncclTeamRail(comm); live comm)
}

/// Forwards to the real `ncclLsaBarrierCreateRequirement` (device API).
#[no_mangle]
pub extern "C" fn ncclLsaBarrierCreateRequirement(
    team: ncclTeam_t,
    nBarriers: c_int,
    outHandle: *mut DeviceApiOpaque,
    outReq: *mut DeviceApiOpaque,
) -> ResultCode {
    forward!(ncclLsaBarrierCreateRequirement(team, nBarriers, outHandle, outReq); team team; require nBarriers >= 0 => "nBarriers is negative"; outputs outHandle, outReq)
}

/// Forwards to the real `ncclGinBarrierCreateRequirement` (device API).
#[no_mangle]
pub extern "C" fn ncclGinBarrierCreateRequirement(
    comm: ncclComm_t,
    team: ncclTeam_t,
    nBarriers: c_int,
    outHandle: *mut DeviceApiOpaque,
    outReq: *mut DeviceApiOpaque,
) -> ResultCode {
    forward!(ncclGinBarrierCreateRequirement(comm, team, nBarriers, outHandle, outReq); live comm; team team; require nBarriers >= 0 => "nBarriers is negative"; outputs outHandle, outReq)
}

/// Forwards to the real `ncclLLA2ACalcSlots` (device API).
#[no_mangle]
pub extern "C" fn ncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int {
    forward!(ncclLLA2ACalcSlots(maxElts, maxEltSize); require maxElts >= 0 && maxEltSize >= 1 => "maxElts is negative or maxEltSize below 1")
}

/// Forwards to the real `ncclLLA2ACreateRequirement` (device API).
#[no_mangle]
pub extern "C" fn ncclLLA2ACreateRequirement(
    nBlocks: c_int,
    nSlots: c_int,
    outHandle: *mut DeviceApiOpaque,
    outReq: *mut DeviceApiOpaque,
) -> ResultCode {
    forward!(ncclLLA2ACreateRequirement(nBlocks, nSlots, outHandle, outReq); require nBlocks >= 1 && nSlots >= 1 => "nBlocks or nSlots below 1"; outputs outHandle, outReq)
}

/// Forwards to the real `ncclGinOutboxCreateRequirement` (device API).
#[no_mangle]
pub extern "C" fn ncclGinOutboxCreateRequirement(
    nBlocks: c_int,
    size_log2: c_int,
    outHandle: *mut DeviceApiOpaque,
    outReq: *mut DeviceApiOpaque,
) -> ResultCode {
    forward!(ncclGinOutboxCreateRequirement(nBlocks, size_log2, outHandle, outReq); require nBlocks >= 1 && (0..63).contains(&size_log2) => "nBlocks below 1 or size_log2 outside 0..63"; outputs outHandle, outReq)
}

/// Forwards to the real `ncclGinInboxA2ACreateRequirement` (device API).
#[no_mangle]
pub extern "C" fn ncclGinInboxA2ACreateRequirement(
    peers: ncclTeam_t,
    nBlocks: c_int,
    size_log2: c_int,
    outHandle: *mut DeviceApiOpaque,
    outReq: *mut DeviceApiOpaque,
) -> ResultCode {
    forward!(ncclGinInboxA2ACreateRequirement(peers, nBlocks, size_log2, outHandle, outReq); team peers; require peers.nRanks >= 2 && nBlocks >= 1 && (0..63).contains(&size_log2) => "peers has fewer than 2 ranks (NCCL divides by the other ranks), nBlocks is below 1 or size_log2 outside 0..63"; outputs outHandle, outReq)
}
