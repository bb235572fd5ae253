//! Check data: inputs whose reduction is exactly predictable, and the comparison.
//!
//! Inputs are small integers (`-4..=4`; `{1, -1}` for prod; `0..=8` for unsigned types), stored
//! in the element type, so sums, maxima, minima and products are exact in every type and every
//! order: a mismatch is a real error. Float `avg` and `premulsum` scale each input first (by
//! `1/n` or the rank's scalar, rounded to the element type); their results are compared within
//! a few units in the last place of the element type, integers exactly.

use crate::reduce::{float16, DataType, ReduceOp};

/// Rank `rank`'s input element `i` for check round `seed`.
///
/// It depends on `i` only through `i mod PERIOD`, which lets inputs and checks work on tiles.
pub fn value(dtype: DataType, op: ReduceOp, rank: usize, i: usize, seed: usize) -> i64 {
    let h = (i.wrapping_mul(7) + rank.wrapping_mul(13) + seed.wrapping_mul(5)) % 9;
    match op {
        ReduceOp::Prod => 1 - 2 * (h % 2) as i64,
        _ if dtype.is_float() || matches!(dtype, DataType::I8 | DataType::I32 | DataType::I64) => {
            h as i64 - 4
        }
        _ => h as i64,
    }
}

/// The PreMulSum scalar of `rank`, as nccl-tests uses it: 1 on even ranks, 2 on odd ones.
pub fn premul_scalar(rank: usize) -> i64 {
    if rank % 2 == 0 {
        1
    } else {
        2
    }
}

/// `v` in the element type's little-endian bytes.
pub fn encode(dtype: DataType, v: f64) -> Vec<u8> {
    match dtype {
        DataType::I8 => (v as i64 as i8).to_le_bytes().to_vec(),
        DataType::U8 => (v as i64 as u8).to_le_bytes().to_vec(),
        DataType::I32 => (v as i64 as i32).to_le_bytes().to_vec(),
        DataType::U32 => (v as i64 as u32).to_le_bytes().to_vec(),
        DataType::I64 => (v as i64).to_le_bytes().to_vec(),
        DataType::U64 => (v as i64 as u64).to_le_bytes().to_vec(),
        DataType::F16 => float16::f32_to_f16(v as f32).to_le_bytes().to_vec(),
        DataType::Bf16 => float16::f32_to_bf16(v as f32).to_le_bytes().to_vec(),
        DataType::F32 => (v as f32).to_le_bytes().to_vec(),
        DataType::F64 => v.to_le_bytes().to_vec(),
    }
}

/// Decodes one element as f64 (exact for every value the check produces).
pub fn decode(dtype: DataType, b: &[u8]) -> f64 {
    match dtype {
        DataType::I8 => b[0] as i8 as f64,
        DataType::U8 => b[0] as f64,
        DataType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::U32 => u32::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::U64 => u64::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::F16 => float16::f16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
        DataType::Bf16 => float16::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
        DataType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
    }
}

/// Inputs and expectations repeat with this period in the element index (see [`value`]).
const PERIOD: usize = 9;

/// `PERIOD` consecutive elements from `i = 0`, encoded, tiled to `count` elements into `out`
/// (replacing its contents; its allocation is reused).
fn tile_into(out: &mut Vec<u8>, dtype: DataType, count: usize, element: impl Fn(usize) -> f64) {
    let pattern: Vec<u8> = (0..PERIOD)
        .flat_map(|i| encode(dtype, element(i)))
        .collect();
    let bytes = count * dtype.size();
    out.clear();
    out.extend_from_slice(&pattern[..bytes.min(pattern.len())]);
    // Doubling: each copy appends what is already there, so a whole period stays aligned.
    while out.len() < bytes {
        let take = out.len().min(bytes - out.len());
        out.extend_from_within(..take);
    }
}

/// Rank `rank`'s whole input for check round `seed`.
pub fn input(dtype: DataType, op: ReduceOp, rank: usize, count: usize, seed: usize) -> Vec<u8> {
    let mut out = Vec::new();
    input_into(&mut out, dtype, op, rank, count, seed);
    out
}

/// [`input`] into an existing buffer (long runs reuse one, sparing the page faults of fresh
/// memory on every call).
pub fn input_into(
    out: &mut Vec<u8>,
    dtype: DataType,
    op: ReduceOp,
    rank: usize,
    count: usize,
    seed: usize,
) {
    tile_into(out, dtype, count, |i| {
        value(dtype, op, rank, i, seed) as f64
    })
}

/// The exact expected element `i`, in f64.
pub fn expected(dtype: DataType, op: ReduceOp, ranks: usize, i: usize, seed: usize) -> f64 {
    let values = (0..ranks).map(|r| value(dtype, op, r, i, seed));
    match op {
        ReduceOp::Sum => values.sum::<i64>() as f64,
        ReduceOp::Prod => values.product::<i64>() as f64,
        ReduceOp::Max => values.max().unwrap() as f64,
        ReduceOp::Min => values.min().unwrap() as f64,
        ReduceOp::Avg if dtype.is_float() => values.sum::<i64>() as f64 / ranks as f64,
        ReduceOp::Avg => {
            let wrapped = decode(dtype, &encode(dtype, values.sum::<i64>() as f64)) as i64;
            (wrapped / ranks as i64) as f64
        }
        ReduceOp::PreMulSum => (0..ranks)
            .map(|r| value(dtype, op, r, i, seed) * premul_scalar(r))
            .sum::<i64>() as f64,
    }
}

/// Allowed distance from the exact value: none, except for scaled float inputs.
fn tolerance(dtype: DataType, op: ReduceOp, ranks: usize, exact: f64) -> f64 {
    let scaled = matches!(op, ReduceOp::Avg | ReduceOp::PreMulSum) && dtype.is_float();
    if !scaled {
        return 0.0;
    }
    let epsilon = match dtype {
        DataType::F16 => 2f64.powi(-10),
        DataType::Bf16 => 2f64.powi(-7),
        DataType::F32 => 2f64.powi(-23),
        _ => 2f64.powi(-52),
    };
    (exact.abs().max(4.0)) * epsilon * (ranks as f64 + 2.0)
}

/// Elements of `output` that differ from the expectation.
pub fn count_wrong(dtype: DataType, op: ReduceOp, ranks: usize, output: &[u8], seed: usize) -> u64 {
    let size = dtype.size();
    let wants: Vec<f64> = (0..PERIOD)
        .map(|i| expected(dtype, op, ranks, i, seed))
        .collect();
    let encoded: Vec<Vec<u8>> = wants.iter().map(|&w| encode(dtype, w)).collect();
    let is_wrong = |i: usize, got: &[u8]| {
        let residue = i % PERIOD;
        if got == encoded[residue].as_slice() {
            return false;
        }
        // Integers must match exactly; floats may differ within the tolerance (a NaN never does).
        let want = wants[residue];
        let close = (decode(dtype, got) - want).abs() <= tolerance(dtype, op, ranks, want);
        !(dtype.is_float() && close)
    };
    // Whole periods that match the expected tile bytewise are right; the rest are checked
    // element by element.
    let tile: Vec<u8> = encoded.concat();
    output
        .chunks(tile.len())
        .enumerate()
        .filter(|(_, period)| *period != &tile[..period.len()])
        .map(|(p, period)| {
            period
                .chunks_exact(size)
                .enumerate()
                .filter(|(j, got)| is_wrong(p * PERIOD + j, got))
                .count() as u64
        })
        .sum()
}

/// An FNV-1a style digest of a buffer, folded a 64-bit word at a time: ranks compare these to
/// show their outputs are bitwise identical.
pub fn digest(bytes: &[u8]) -> u64 {
    let words = bytes.chunks_exact(8);
    let tail = words.remainder();
    let h = words.fold(0xcbf2_9ce4_8422_2325, |h, w| {
        digest_word(h, u64::from_le_bytes(w.try_into().expect("8 bytes")))
    });
    tail.iter().fold(h, |h, &b| digest_word(h, b as u64))
}

fn digest_word(h: u64, word: u64) -> u64 {
    (h ^ word).wrapping_mul(0x100_0000_01b3)
}

/// Folds one more value into a running FNV-1a digest.
pub fn digest_more(digest: u64, value: u64) -> u64 {
    value
        .to_le_bytes()
        .iter()
        .fold(digest, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_correct_reduction_has_no_wrong_elements_and_a_broken_one_does() {
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                let ranks = 5;
                let out: Vec<u8> = (0..100)
                    .flat_map(|i| encode(dtype, expected(dtype, op, ranks, i, 3)))
                    .collect();
                assert_eq!(
                    count_wrong(dtype, op, ranks, &out, 3),
                    0,
                    "{dtype:?} {op:?}"
                );
                let mut broken = out.clone();
                let last = broken.len() - 1;
                broken[last] ^= 0x40;
                assert!(
                    count_wrong(dtype, op, ranks, &broken, 3) >= 1,
                    "{dtype:?} {op:?}"
                );
            }
        }
    }
}
