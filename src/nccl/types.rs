//! The C types of the NCCL API (2.18 through 2.32), as the ABI sees them.
//!
//! Two kinds of definitions live here:
//! - **Carriers** used in every exported signature: `#[repr(transparent)]` integers for
//!   result codes, data types, reduction ops and the other C enums. A value that arrives from C
//!   is never turned into a Rust `enum`, so an unknown code (2.30 added `ncclTimeout = 8`) or a
//!   dynamic reduction op passes through bit for bit.
//! - **Header enums** (`ncclResult_t`, `ncclDataType_t`, ...) that exist only so cbindgen can
//!   write NVIDIA's enum definitions into `include/nccl.h`; the header generator renames each
//!   carrier to the matching enum name.
//!
//! Layouts are those of NCCL 2.32.3 on x86-64; `tests/c/conformance.c` compiles NVIDIA's own
//! header against ours and static-asserts the sizes.

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use std::os::raw::{c_char, c_int, c_uint, c_void};

/// `NCCL_MAJOR` of the API this header mirrors.
pub const NCCL_MAJOR: c_int = 2;
/// `NCCL_MINOR` of the API this header mirrors.
pub const NCCL_MINOR: c_int = 32;
/// `NCCL_PATCH` of the API this header mirrors.
pub const NCCL_PATCH: c_int = 3;
/// `NCCL_VERSION_CODE`: `NCCL_VERSION(2, 32, 3)`.
pub const NCCL_VERSION_CODE: c_int = 23203;
/// Bytes in an `ncclUniqueId`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;
/// The magic NCCL expects in versioned structs (`ncclConfig_t`, `ncclCollConfig_t`, ...).
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
/// Marks an `int` field of `ncclConfig_t` as unset.
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// The color that leaves a rank out of every communicator made by `ncclCommSplit`.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// `ncclCommWindowRegister` flag: default registration.
pub const NCCL_WIN_DEFAULT: c_int = 0x00;
/// `ncclCommWindowRegister` flag: a symmetric window for collectives.
pub const NCCL_WIN_COLL_SYMMETRIC: c_int = 0x01;
/// `ncclCommWindowRegister` flag: strict ordering.
pub const NCCL_WIN_STRICT_ORDERING: c_int = 0x02;
/// `ncclCommWindowRegister` flag: register for GIN only.
pub const NCCL_WIN_GIN_ONLY: c_int = 0x04;
/// `ncclCommWindowRegister` flag: CFT counted only.
pub const NCCL_WIN_CFT_COUNTED: c_int = 0x08;
/// Alignment required of window buffers, in bytes.
pub const NCCL_WIN_REQUIRED_ALIGNMENT: c_int = 4096;
/// CTA policy: NCCL's default.
pub const NCCL_CTA_POLICY_DEFAULT: c_int = 0x00;
/// CTA policy: favour efficiency.
pub const NCCL_CTA_POLICY_EFFICIENCY: c_int = 0x01;
/// CTA policy: zero CTAs where possible.
pub const NCCL_CTA_POLICY_ZERO: c_int = 0x02;
/// `ncclCommShrink` flag: shrink the parent.
pub const NCCL_SHRINK_DEFAULT: c_int = 0x00;
/// `ncclCommShrink` flag: abort the parent's operations first.
pub const NCCL_SHRINK_ABORT: c_int = 0x01;
/// `ncclCommRevoke` flag: the only defined value.
pub const NCCL_REVOKE_DEFAULT: c_int = 0x00;
/// `ncclCommSuspend` flag: release dynamic allocations.
pub const NCCL_SUSPEND_MEM: c_int = 0x01;

/// Opaque communicator; only ever handled through [`ncclComm_t`].
pub struct ncclComm {
    _opaque: [u8; 0],
}
/// A communicator handle, returned to the caller exactly as the real NCCL made it.
pub type ncclComm_t = *mut ncclComm;

/// Opaque registered window.
pub struct ncclWindow_vidmem {
    _opaque: [u8; 0],
}
/// A window handle from `ncclCommWindowRegister`.
pub type ncclWindow_t = *mut ncclWindow_vidmem;

/// Opaque parameter handle (2.32 parameter API).
pub struct ncclParamHandle {
    _opaque: [u8; 0],
}
/// A handle from `ncclParamBind`.
pub type ncclParamHandle_t = *mut ncclParamHandle;

/// Opaque CUDA stream; declared by the header only when the CUDA runtime headers are absent.
pub struct CUstream_st {
    _opaque: [u8; 0],
}
/// A CUDA stream.
pub type cudaStream_t = *mut CUstream_st;

/// Opaque CUDA event; declared by the header only when the CUDA runtime headers are absent.
pub struct CUevent_st {
    _opaque: [u8; 0],
}
/// A CUDA event.
pub type cudaEvent_t = *mut CUevent_st;

/// The bootstrap identifier that every rank of a communicator passes to init; 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    /// Opaque bytes made by `ncclGetUniqueId`.
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

/// Carrier of an `ncclResult_t` value. Any integer may appear; see [`ResultCode::KNOWN`].
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ResultCode(pub c_int);

impl ResultCode {
    pub const SUCCESS: ResultCode = ResultCode(0);
    pub const UNHANDLED_CUDA_ERROR: ResultCode = ResultCode(1);
    pub const SYSTEM_ERROR: ResultCode = ResultCode(2);
    pub const INTERNAL_ERROR: ResultCode = ResultCode(3);
    pub const INVALID_ARGUMENT: ResultCode = ResultCode(4);
    pub const INVALID_USAGE: ResultCode = ResultCode(5);
    pub const REMOTE_ERROR: ResultCode = ResultCode(6);
    pub const IN_PROGRESS: ResultCode = ResultCode(7);
    pub const TIMEOUT: ResultCode = ResultCode(8);

    /// Whether this is `ncclSuccess`.
    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }
}

/// Carrier of an `ncclDataType_t` value; values outside the enum are carried, not trusted.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DataTypeCode(pub c_int);

/// Carrier of an `ncclRedOp_t` value: a built-in op (0..=4) or an opaque dynamic one.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RedOpCode(pub c_int);

/// Carrier of an `ncclScalarResidence_t` value.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ScalarResidenceCode(pub c_int);

/// Carrier of an `ncclCommMemStat_t` value.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MemStatCode(pub c_int);

/// NCCL's result codes (header only; exported functions use [`ResultCode`]).
#[repr(C)]
pub enum ncclResult_t {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclTimeout = 8,
    ncclNumResults = 9,
}

/// Sizes `ncclRedOp_t` (header only).
#[repr(C)]
pub enum ncclRedOp_dummy_t {
    ncclNumOps_dummy = 5,
}

/// Reduction operations (header only; exported functions use [`RedOpCode`]).
#[repr(C)]
pub enum ncclRedOp_t {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    /// The number of built-in ops, and the least value a dynamic op can take.
    ncclNumOps = 5,
    /// The largest valid op value for a 4-byte enum.
    ncclMaxRedOp = 0x7fff_ffff,
}

/// Element types (header only; exported functions use [`DataTypeCode`]). The aliases
/// `ncclChar`, `ncclInt`, `ncclHalf`, `ncclFloat` and `ncclDouble` are defined by the header.
#[repr(C)]
pub enum ncclDataType_t {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12,
}

/// Where the scalar of a PreMulSum op lives (header only).
#[repr(C)]
pub enum ncclScalarResidence_t {
    /// In device memory, read when the collective runs.
    ncclScalarDevice = 0,
    /// In host memory, read before `ncclRedOpCreatePreMulSum` returns.
    ncclScalarHostImmediate = 1,
}

/// Memory statistics of `ncclCommMemStats` (header only).
#[repr(C)]
pub enum ncclCommMemStat_t {
    ncclStatGpuMemSuspend = 0,
    ncclStatGpuMemSuspended = 1,
    ncclStatGpuMemPersist = 2,
    ncclStatGpuMemTotal = 3,
}

/// Host CFT modes of `ncclConfig_t::hostCftMode` (header only).
#[repr(C)]
pub enum ncclHostCftMode_t {
    ncclHostCftDefault = -2_147_483_648,
    ncclHostCftEnable = 1,
    ncclHostCftDisable = 2,
    ncclHostCftFallback = 3,
}

/// Host NVLS component flags of `ncclConfig_t::nvlsHostMode` (header only).
#[repr(C)]
pub enum ncclNvlsHostMode_t {
    ncclNvlsHostModeDefault = -2_147_483_648,
    ncclNvlsHostModeEnable = 0,
    ncclNvlsHostModeDisableTransport = 1,
    ncclNvlsHostModeDisableSymmetricMultimem = 2,
    ncclNvlsHostModeDisable = 0x7fff_ffff,
}

/// Encryption modes of `ncclEncryptionConfig_t` (header only).
#[repr(C)]
pub enum ncclEncryptionMode_t {
    NCCL_ENCRYPTION_MODE_NONE = 0,
    NCCL_ENCRYPTION_MODE_PSK = 1,
}

/// Communicator configuration, NCCL 2.32 layout (`ncclConfig_v23100`, 120 bytes).
///
/// Callers built against older headers pass shorter structs: read a field only when it lies
/// within `size` and the caller's `version` knows it (see `crate::registry::config`).
#[repr(C)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
    pub graphUsageMode: c_int,
    pub numRmaCtx: c_int,
    pub maxP2pPeers: c_int,
    pub graphStreamOrdering: c_int,
    pub launchOrderImplicit: c_int,
    pub numRmaSig: c_int,
    pub rmaEagerInit: c_int,
    pub hostCftMode: c_int,
    pub nvlsHostMode: c_int,
}

/// The key of one vendor extension option.
#[repr(C)]
pub struct ncclConfigExtKey {
    pub vendorId: c_int,
    pub optionId: c_int,
}

/// The value of one vendor extension option.
#[repr(C)]
pub union ncclConfigExtValue {
    pub i: c_int,
    pub s: *const c_char,
    pub raw: *mut c_void,
}

/// A vendor-specific option in a `ncclCollConfig_t` chain.
#[repr(C)]
pub struct ncclConfigExt_t {
    pub next: *mut ncclConfigExt_t,
    pub key: ncclConfigExtKey,
    pub val: ncclConfigExtValue,
}

/// Per-collective configuration of the `nccl*Config` entry points (2.32).
#[repr(C)]
pub struct ncclCollConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub ext: *mut ncclConfigExt_t,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub nvlsCTAs: c_int,
    pub cgaClusterSize: c_int,
    pub algSelection: *const c_char,
    pub forceAlgSelection: c_int,
    pub CTAPolicy: c_int,
    pub userProfilerTag: u64,
    pub launchCompletionEvent: cudaEvent_t,
}

/// Output of `ncclGroupSimulateEnd`.
#[repr(C)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    /// Estimated time of the simulated group, in microseconds.
    pub estimatedTime: f32,
}

/// One wait of `ncclWaitSignal`.
#[repr(C)]
pub struct ncclWaitSignalDesc_t {
    pub opCnt: c_int,
    pub peer: c_int,
    pub sigIdx: c_int,
    pub ctx: c_int,
}

/// Transport encryption settings of `ncclSetEncryption` (2.32).
#[repr(C)]
pub struct ncclEncryptionConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub mode: c_int,
    pub psk: *const c_char,
}

/// A team of the device API, returned by value (12 bytes); not part of `nccl.h`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ncclTeam_t {
    pub nRanks: c_int,
    pub rank: c_int,
    pub stride: c_int,
}

impl ncclTeam_t {
    /// Whether a communicator could have produced this team: at least one rank, this rank
    /// inside it, a positive stride.
    pub fn is_plausible(&self) -> bool {
        self.nRanks >= 1 && (0..self.nRanks).contains(&self.rank) && self.stride >= 1
    }
}

/// A multimem handle of the device API, passed by value (one pointer); not part of `nccl.h`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclMultimemHandle_t {
    pub mcBasePtr: *mut c_void,
}

/// Opaque device-API structs, only ever passed by pointer; not part of `nccl.h`.
pub type DeviceApiOpaque = c_void;
