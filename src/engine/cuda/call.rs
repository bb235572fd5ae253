//! One `ncclAllReduce` as the GPU engine takes it.

use super::args::Operands;
use crate::nccl::types::{cudaStream_t, ncclComm_t, DataTypeCode, RedOpCode};
use crate::reduce::{DataType, ReduceOp, Scale};

/// One `ncclAllReduce`, as the engine needs it: the call's arguments as NCCL takes them (to
/// hand it to NCCL), and as our kernels take them.
pub struct EngineCall {
    pub comm: ncclComm_t,
    pub rank: usize,
    pub ranks: usize,
    pub device: i32,
    pub send: u64,
    pub recv: u64,
    pub count: usize,
    /// The caller's `ncclDataType_t` and `ncclRedOp_t`, passed to NCCL unchanged.
    pub nccl_dtype: DataTypeCode,
    pub nccl_op: RedOpCode,
    pub dtype: DataType,
    pub op: ReduceOp,
    /// The copy-in scaling (`Scale::for_op`), computed by the caller.
    pub scale: Scale,
    pub stream: cudaStream_t,
}

impl EngineCall {
    /// What the call's kernel reduces.
    pub fn operands(&self) -> Operands {
        Operands {
            count: self.count,
            dtype: self.dtype,
            op: self.op,
            scale: self.scale,
            input: self.send,
            output: self.recv,
        }
    }

    /// How log lines name the call's communicator.
    pub fn label(&self) -> String {
        format!("communicator {:p}", self.comm)
    }
}
