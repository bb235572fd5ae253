//! Why a GPU-engine call failed, and what a kernel's status word means.

use crate::engine::cuda::driver::GpuError;
use crate::gpu::launch::{
    STATUS_ABORTED, STATUS_BAD_PLAN, STATUS_OK, STATUS_PEER_FAILED, STATUS_TIMEOUT,
};
use crate::nccl::types::ResultCode;

/// Why a GPU-engine call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The driver refused something.
    Gpu(GpuError),
    /// The plan does not fit this communicator's staging or shape.
    Unfit(String),
    /// A kernel of this rank gave up (a `STATUS_*`); the communicator is unusable.
    Failed(u32),
    /// NCCL's own call, made by the engine (its work captured apart for a graph), failed.
    Nccl(ResultCode),
}

impl CallError {
    /// The NCCL code a caller reports.
    pub fn nccl_code(&self) -> ResultCode {
        match self {
            CallError::Gpu(_) => ResultCode::UNHANDLED_CUDA_ERROR,
            CallError::Unfit(_) => ResultCode::INVALID_USAGE,
            CallError::Failed(STATUS_PEER_FAILED) => ResultCode::REMOTE_ERROR,
            CallError::Failed(STATUS_BAD_PLAN) => ResultCode::INTERNAL_ERROR,
            CallError::Failed(_) => ResultCode::SYSTEM_ERROR,
            CallError::Nccl(code) => *code,
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Gpu(e) => write!(f, "{e}"),
            CallError::Unfit(why) => write!(f, "{why}"),
            CallError::Failed(status) => write!(f, "{}", status_text(*status)),
            CallError::Nccl(code) => write!(f, "NCCL returned {} for the call it captured", code.0),
        }
    }
}

/// What a kernel's `STATUS_*` means.
pub fn status_text(status: u32) -> &'static str {
    match status {
        STATUS_OK => "no error",
        STATUS_ABORTED => {
            "aborted (ncclCommAbort or ncclCommRevoke, or a launch or record of this rank that failed on the host)"
        }
        STATUS_TIMEOUT => "a wait exceeded STRAGGLAR_TIMEOUT_MS",
        STATUS_PEER_FAILED => "a peer rank failed",
        STATUS_BAD_PLAN => "the kernel was given a corrupt plan",
        _ => "unknown kernel status",
    }
}

impl std::error::Error for CallError {}

impl From<GpuError> for CallError {
    fn from(e: GpuError) -> Self {
        CallError::Gpu(e)
    }
}
