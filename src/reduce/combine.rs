//! The three element-wise operations of a reduction: [`prescale`] at copy-in, [`combine`] for
//! each reduction step, [`finish`] once a value holds every rank's contribution.

use super::float16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use super::{DataType, ReduceOp};

/// How a rank's input is scaled at copy-in, before any combining.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Unchanged.
    None,
    /// Multiplied by a scalar of the element type, given as its little-endian bytes (the first
    /// `size()` bytes are used).
    By([u8; 8]),
}

impl Scale {
    /// The copy-in scaling `op` asks of a rank: `1/nranks` for float `Avg`, the rank's own
    /// scalar (element bytes) for `PreMulSum`, nothing otherwise. `None` for a PreMulSum whose
    /// scalar this engine cannot read (a device-resident one): such a call must not run here.
    pub fn for_op(
        op: ReduceOp,
        dtype: DataType,
        nranks: usize,
        premul_scalar: Option<[u8; 8]>,
    ) -> Option<Scale> {
        match op {
            ReduceOp::Avg if dtype.is_float() => Some(Scale::By(reciprocal_bytes(dtype, nranks))),
            ReduceOp::PreMulSum => premul_scalar.map(Scale::By),
            _ => Some(Scale::None),
        }
    }
}

/// `1/n` rounded to the element type, as little-endian bytes.
fn reciprocal_bytes(dtype: DataType, n: usize) -> [u8; 8] {
    let r = 1.0 / n as f64;
    let mut out = [0u8; 8];
    match dtype {
        DataType::F64 => out.copy_from_slice(&r.to_le_bytes()),
        DataType::F32 => out[..4].copy_from_slice(&(r as f32).to_le_bytes()),
        DataType::F16 => out[..2].copy_from_slice(&f32_to_f16(r as f32).to_le_bytes()),
        DataType::Bf16 => out[..2].copy_from_slice(&f32_to_bf16(r as f32).to_le_bytes()),
        _ => {}
    }
    out
}

/// The binary operation a reduction step applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Combiner {
    Sum,
    Prod,
    Max,
    Min,
}

impl From<ReduceOp> for Combiner {
    fn from(op: ReduceOp) -> Self {
        match op {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum => Combiner::Sum,
            ReduceOp::Prod => Combiner::Prod,
            ReduceOp::Max => Combiner::Max,
            ReduceOp::Min => Combiner::Min,
        }
    }
}

/// One element type: how it loads into its accumulator, combines and stores.
trait Lane {
    /// Bytes per element.
    const SIZE: usize;
    /// The accumulator: the type itself, or f32 for fp16 and bf16.
    type Acc: Copy + Default;
    fn load(bytes: &[u8]) -> Self::Acc;
    fn store(acc: Self::Acc, bytes: &mut [u8]);
    fn apply(c: Combiner, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn multiply(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn divide(a: Self::Acc, n: usize) -> Self::Acc;
}

macro_rules! integer_lane {
    ($name:ident, $t:ty) => {
        struct $name;
        impl Lane for $name {
            const SIZE: usize = std::mem::size_of::<$t>();
            type Acc = $t;
            fn load(bytes: &[u8]) -> $t {
                <$t>::from_le_bytes(bytes.try_into().expect("element width"))
            }
            fn store(acc: $t, bytes: &mut [u8]) {
                bytes.copy_from_slice(&acc.to_le_bytes());
            }
            fn apply(c: Combiner, a: $t, b: $t) -> $t {
                match c {
                    Combiner::Sum => a.wrapping_add(b),
                    Combiner::Prod => a.wrapping_mul(b),
                    Combiner::Max => a.max(b),
                    Combiner::Min => a.min(b),
                }
            }
            fn multiply(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
            fn divide(a: $t, n: usize) -> $t {
                (a as i128 / n as i128) as $t
            }
        }
    };
}

integer_lane!(I8Lane, i8);
integer_lane!(U8Lane, u8);
integer_lane!(I32Lane, i32);
integer_lane!(U32Lane, u32);
integer_lane!(I64Lane, i64);
integer_lane!(U64Lane, u64);

macro_rules! float_lane {
    ($name:ident, $t:ty) => {
        struct $name;
        impl Lane for $name {
            const SIZE: usize = std::mem::size_of::<$t>();
            type Acc = $t;
            fn load(bytes: &[u8]) -> $t {
                <$t>::from_le_bytes(bytes.try_into().expect("element width"))
            }
            fn store(acc: $t, bytes: &mut [u8]) {
                bytes.copy_from_slice(&acc.to_le_bytes());
            }
            fn apply(c: Combiner, a: $t, b: $t) -> $t {
                match c {
                    Combiner::Sum => a + b,
                    Combiner::Prod => a * b,
                    // Spelled out rather than `max`/`min` (which leave the sign of a zero tie
                    // unspecified), as cuda/stragglar_reduce.h computes them.
                    Combiner::Max if a.is_nan() || b > a => b,
                    Combiner::Min if a.is_nan() || b < a => b,
                    Combiner::Max | Combiner::Min => a,
                }
            }
            fn multiply(a: $t, b: $t) -> $t {
                a * b
            }
            fn divide(a: $t, _n: usize) -> $t {
                a
            }
        }
    };
}

float_lane!(F32Lane, f32);
float_lane!(F64Lane, f64);

macro_rules! half_lane {
    ($name:ident, $widen:ident, $narrow:ident) => {
        struct $name;
        impl Lane for $name {
            const SIZE: usize = 2;
            type Acc = f32;
            fn load(bytes: &[u8]) -> f32 {
                $widen(u16::from_le_bytes([bytes[0], bytes[1]]))
            }
            fn store(acc: f32, bytes: &mut [u8]) {
                bytes.copy_from_slice(&$narrow(acc).to_le_bytes());
            }
            fn apply(c: Combiner, a: f32, b: f32) -> f32 {
                F32Lane::apply(c, a, b)
            }
            fn multiply(a: f32, b: f32) -> f32 {
                a * b
            }
            fn divide(a: f32, _n: usize) -> f32 {
                a
            }
        }
    };
}

half_lane!(F16Lane, f16_to_f32, f32_to_f16);
half_lane!(Bf16Lane, bf16_to_f32, f32_to_bf16);

/// Calls `$body` with `$lane` bound to the lane type of `$dtype`.
macro_rules! with_lane {
    ($dtype:expr, $lane:ident => $body:expr) => {
        match $dtype {
            DataType::I8 => {
                type $lane = I8Lane;
                $body
            }
            DataType::U8 => {
                type $lane = U8Lane;
                $body
            }
            DataType::I32 => {
                type $lane = I32Lane;
                $body
            }
            DataType::U32 => {
                type $lane = U32Lane;
                $body
            }
            DataType::I64 => {
                type $lane = I64Lane;
                $body
            }
            DataType::U64 => {
                type $lane = U64Lane;
                $body
            }
            DataType::F16 => {
                type $lane = F16Lane;
                $body
            }
            DataType::F32 => {
                type $lane = F32Lane;
                $body
            }
            DataType::F64 => {
                type $lane = F64Lane;
                $body
            }
            DataType::Bf16 => {
                type $lane = Bf16Lane;
                $body
            }
        }
    };
}

/// Elements combined per block: accumulators live in a small stack array, so fp16/bf16 keep
/// fp32 partial results across all operands and the loops stay simple enough to vectorise.
const BLOCK: usize = 512;

fn combine_lane<L: Lane>(c: Combiner, inputs: &[&[u8]], out: &mut [u8]) {
    let (first, rest) = inputs.split_first().expect("at least one input");
    let block_bytes = BLOCK * L::SIZE;
    for (b, out_block) in out.chunks_mut(block_bytes).enumerate() {
        let bytes = b * block_bytes..b * block_bytes + out_block.len();
        let mut acc = [L::Acc::default(); BLOCK];
        let acc = &mut acc[..out_block.len() / L::SIZE];
        for (a, e) in acc
            .iter_mut()
            .zip(first[bytes.clone()].chunks_exact(L::SIZE))
        {
            *a = L::load(e);
        }
        for input in rest {
            for (a, e) in acc
                .iter_mut()
                .zip(input[bytes.clone()].chunks_exact(L::SIZE))
            {
                *a = L::apply(c, *a, L::load(e));
            }
        }
        for (a, e) in acc.iter().zip(out_block.chunks_exact_mut(L::SIZE)) {
            L::store(*a, e);
        }
    }
}

/// One reduction step: `out = inputs[0] ⊕ inputs[1] ⊕ ...`, element-wise, in this operand
/// order, with fp16/bf16 accumulated in fp32 and rounded once. All slices have the same length,
/// a multiple of the element size; `out` is a separate buffer.
pub fn combine(dtype: DataType, op: ReduceOp, inputs: &[&[u8]], out: &mut [u8]) {
    assert!(
        inputs.iter().all(|i| i.len() == out.len()),
        "operands of different lengths"
    );
    assert_eq!(
        out.len() % dtype.size(),
        0,
        "not a whole number of elements"
    );
    let c = Combiner::from(op);
    with_lane!(dtype, L => combine_lane::<L>(c, inputs, out))
}

fn prescale_lane<L: Lane>(scalar: &[u8], data: &mut [u8]) {
    let s = L::load(&scalar[..L::SIZE]);
    for slot in data.chunks_exact_mut(L::SIZE) {
        let v = L::multiply(L::load(slot), s);
        L::store(v, slot);
    }
}

/// Applies a rank's copy-in scaling in place (one rounding per element).
pub fn prescale(dtype: DataType, scale: Scale, data: &mut [u8]) {
    if let Scale::By(scalar) = scale {
        with_lane!(dtype, L => prescale_lane::<L>(&scalar, data))
    }
}

fn divide_lane<L: Lane>(n: usize, data: &mut [u8]) {
    for slot in data.chunks_exact_mut(L::SIZE) {
        let v = L::divide(L::load(slot), n);
        L::store(v, slot);
    }
}

/// Completes a value that holds all `nranks` contributions: integer `Avg` divides by `nranks`;
/// everything else is already final.
pub fn finish(dtype: DataType, op: ReduceOp, nranks: usize, data: &mut [u8]) {
    if op == ReduceOp::Avg && !dtype.is_float() {
        with_lane!(dtype, L => divide_lane::<L>(nranks, data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn f32s(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn float_ops() {
        let a = bytes_f32(&[1.0, -2.0, 3.0, f32::NAN]);
        let b = bytes_f32(&[4.0, 5.0, -6.0, 1.0]);
        let mut out = vec![0u8; a.len()];
        combine(DataType::F32, ReduceOp::Sum, &[&a, &b], &mut out);
        assert_eq!(&f32s(&out)[..3], &[5.0, 3.0, -3.0]);
        combine(DataType::F32, ReduceOp::Max, &[&a, &b], &mut out);
        assert_eq!(f32s(&out), vec![4.0, 5.0, 3.0, 1.0], "maxNum: NaN loses");
        combine(DataType::F32, ReduceOp::Prod, &[&a, &b], &mut out);
        assert_eq!(&f32s(&out)[..3], &[4.0, -10.0, -18.0]);
        combine(DataType::F32, ReduceOp::Min, &[&a, &b], &mut out);
        assert_eq!(f32s(&out), vec![1.0, -2.0, -6.0, 1.0]);
    }

    #[test]
    fn integer_sums_wrap_and_avg_divides_after() {
        let a = 250u8.to_le_bytes().to_vec();
        let b = 10u8.to_le_bytes().to_vec();
        let mut out = vec![0u8; 1];
        combine(DataType::U8, ReduceOp::Sum, &[&a, &b], &mut out);
        assert_eq!(out[0], 4);
        let x: Vec<u8> = [7i32, -7].iter().flat_map(|v| v.to_le_bytes()).collect();
        let y: Vec<u8> = [8i32, -8].iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut s = vec![0u8; 8];
        combine(DataType::I32, ReduceOp::Avg, &[&x, &y], &mut s);
        finish(DataType::I32, ReduceOp::Avg, 2, &mut s);
        let got: Vec<i32> = s
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![7, -7], "15/2 and -15/2 truncate toward zero");
        let big = (-100i8).to_le_bytes().to_vec();
        let mut d = big.clone();
        finish(DataType::I8, ReduceOp::Avg, 200, &mut d);
        assert_eq!(d[0] as i8, 0, "division in a wide type");
    }

    #[test]
    fn half_types_accumulate_in_f32_and_round_once() {
        // 2048 + 1 + 1 in fp16: pairwise fp16 rounding gives 2048 (ties to even twice); one
        // fp32 accumulation then one rounding gives 2050.
        let h = |x: f32| f32_to_f16(x).to_le_bytes().to_vec();
        let mut out = vec![0u8; 2];
        combine(
            DataType::F16,
            ReduceOp::Sum,
            &[&h(2048.0), &h(1.0), &h(1.0)],
            &mut out,
        );
        assert_eq!(f16_to_f32(u16::from_le_bytes([out[0], out[1]])), 2050.0);
        let b = |x: f32| f32_to_bf16(x).to_le_bytes().to_vec();
        combine(
            DataType::Bf16,
            ReduceOp::Sum,
            &[&b(256.0), &b(1.0), &b(1.0)],
            &mut out,
        );
        assert_eq!(bf16_to_f32(u16::from_le_bytes([out[0], out[1]])), 258.0);
    }

    #[test]
    fn float_avg_premultiplies_in_the_element_type() {
        let scale = Scale::for_op(ReduceOp::Avg, DataType::F16, 3, None).unwrap();
        let mut x = f32_to_f16(3.0).to_le_bytes().to_vec();
        prescale(DataType::F16, scale, &mut x);
        let third = f16_to_f32(f32_to_f16(1.0 / 3.0));
        let expect = f32_to_f16(3.0 * third);
        assert_eq!(u16::from_le_bytes([x[0], x[1]]), expect);
        assert_eq!(
            Scale::for_op(ReduceOp::Avg, DataType::I32, 3, None).unwrap(),
            Scale::None
        );
    }

    #[test]
    fn premulsum_uses_the_ranks_scalar() {
        let mut scalar = [0u8; 8];
        scalar[..8].copy_from_slice(&0.5f64.to_le_bytes());
        assert_eq!(
            Scale::for_op(ReduceOp::PreMulSum, DataType::F64, 4, None),
            None,
            "no silent plain sum"
        );
        let scale = Scale::for_op(ReduceOp::PreMulSum, DataType::F64, 4, Some(scalar)).unwrap();
        let mut x = 3.0f64.to_le_bytes().to_vec();
        prescale(DataType::F64, scale, &mut x);
        assert_eq!(f64::from_le_bytes(x.try_into().unwrap()), 1.5);
        let mut iscalar = [0u8; 8];
        iscalar[..4].copy_from_slice(&(-3i32).to_le_bytes());
        let mut y = 5i32.to_le_bytes().to_vec();
        prescale(DataType::I32, Scale::By(iscalar), &mut y);
        assert_eq!(i32::from_le_bytes(y.try_into().unwrap()), -15);
    }

    #[test]
    fn names_round_trip() {
        for t in DataType::ALL {
            assert_eq!(DataType::parse(t.name()), Some(t));
            assert_eq!(DataType::from_nccl(t.nccl_code()), Some(t));
        }
        assert_eq!(DataType::from_nccl(10), None, "fp8 is refused");
        for o in ReduceOp::ALL {
            assert_eq!(ReduceOp::parse(o.name()), Some(o));
        }
    }
}
