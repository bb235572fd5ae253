//! Element-wise reduction of NCCL data types, as the engines compute it. Pure: no unsafe.
//!
//! Semantics (what every engine must reproduce bit for bit):
//! - integer sums and products wrap; max and min are exact;
//! - fp16 and bf16 are widened to fp32, combined in fp32 in the given operand order, and
//!   rounded once (to nearest, ties to even) per reduction step;
//! - fp32 and fp64 combine in their own precision, in the given operand order;
//! - float max/min follow IEEE maxNum/minNum (a NaN loses against a number), and a tie (such
//!   as `-0` against `+0`) keeps the first operand;
//! - an fp16 or bf16 result that is NaN is the canonical NaN `0x7fff`
//!   ([`float16::CANONICAL_NAN16`]); fp32 and fp64 NaN payloads are not specified (which
//!   operand's payload survives is up to the compiler and the hardware; GPUs return a canonical
//!   NaN); copies move bytes, payloads included;
//! - `ncclAvg` on floats multiplies each input by `1/n` rounded to the element type before the
//!   sum (as NCCL does); on integers it sums (wrapping) and then divides by `n`, truncating;
//! - PreMulSum multiplies each input by its rank's scalar (in the element type) before the sum;
//! - fp8 types are refused ([`DataType::from_nccl`] returns `None`): NCCL keeps them.

#![forbid(unsafe_code)]

pub mod combine;
pub mod float16;

pub use combine::{combine, finish, prescale, Scale};

/// NCCL data types the engines reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
    F16,
    F32,
    F64,
    Bf16,
}

impl DataType {
    /// Every supported type, in `ncclDataType_t` order.
    pub const ALL: [DataType; 10] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
    ];

    /// From an `ncclDataType_t` value; `None` for fp8 and unknown values.
    pub fn from_nccl(code: i32) -> Option<DataType> {
        Self::ALL.iter().copied().find(|t| t.nccl_code() == code)
    }

    /// The `ncclDataType_t` value.
    pub fn nccl_code(self) -> i32 {
        match self {
            DataType::I8 => 0,
            DataType::U8 => 1,
            DataType::I32 => 2,
            DataType::U32 => 3,
            DataType::I64 => 4,
            DataType::U64 => 5,
            DataType::F16 => 6,
            DataType::F32 => 7,
            DataType::F64 => 8,
            DataType::Bf16 => 9,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::Bf16 | DataType::F32 | DataType::F64
        )
    }

    /// The name nccl-tests prints (`float`, `half`, `bfloat16`, `int32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::Bf16 => "bfloat16",
        }
    }

    /// Parses a name as nccl-tests' `-d` takes it (also `fp16`, `bf16`, `fp32`, ...).
    pub fn parse(name: &str) -> Option<DataType> {
        let alias = match name {
            "fp16" | "float16" => "half",
            "bf16" => "bfloat16",
            "fp32" | "float32" => "float",
            "fp64" | "float64" => "double",
            "int" => "int32",
            "char" => "int8",
            other => other,
        };
        Self::ALL.iter().copied().find(|t| t.name() == alias)
    }
}

/// Reduction operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    /// Sum divided by the number of ranks (see the module docs).
    Avg,
    /// Each rank's input multiplied by that rank's scalar, then summed.
    PreMulSum,
}

impl ReduceOp {
    /// Every op.
    pub const ALL: [ReduceOp; 6] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::PreMulSum,
    ];

    /// The name nccl-tests prints.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum => "premulsum",
        }
    }

    /// Parses a name as nccl-tests' `-o` takes it.
    pub fn parse(name: &str) -> Option<ReduceOp> {
        Self::ALL.iter().copied().find(|o| o.name() == name)
    }
}
