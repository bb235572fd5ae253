//! IEEE binary16 and bfloat16 conversions by bit arithmetic (round to nearest, ties to even),
//! giving the bits the GPU kernels' `cvt.rn` gives, so host and device results agree bit for
//! bit. A NaN narrows to [`CANONICAL_NAN16`] (the kernels pin it too: NaN payloads differ
//! between a GPU's conversions and a CPU's arithmetic).

/// The one NaN a narrowed fp16 or bf16 result takes: positive, quiet, every payload bit set.
pub const CANONICAL_NAN16: u16 = 0x7fff;

/// Widens binary16 bits to f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: normalise into f32.
            let shift = mant.leading_zeros() - 21;
            let mant = (mant << shift) & 0x3ff;
            let exp = 127 - 15 + 1 - shift;
            sign | (exp << 23) | (mant << 13)
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, _) => sign | 0x7fc0_0000 | (mant << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (mant << 13),
    };
    f32::from_bits(bits)
}

/// Rounds f32 to binary16 bits, to nearest with ties to even; overflow gives infinity, a NaN
/// gives [`CANONICAL_NAN16`].
pub fn f32_to_f16(f: f32) -> u16 {
    if f.is_nan() {
        return CANONICAL_NAN16;
    }
    let bits = f.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    if exp == 0xff {
        return sign | 0x7c00;
    }
    let mant = bits & 0x7f_ffff;
    let unbiased = exp - 127;
    if unbiased > 15 {
        return sign | 0x7c00;
    }
    if unbiased >= -14 {
        // Normal in binary16: keep 10 mantissa bits, round the 13 dropped ones.
        let half_bits = (((unbiased + 15) as u32) << 10) | (mant >> 13);
        let rounded = round_shifted(half_bits, mant & 0x1fff, 13);
        return sign | rounded as u16;
    }
    if unbiased < -25 {
        return sign;
    }
    // Subnormal in binary16: the implicit bit joins the mantissa, shifted right.
    let full = mant | 0x80_0000;
    let shift = (-14 - unbiased) as u32 + 13;
    let kept = full >> shift;
    let dropped = full & ((1 << shift) - 1);
    sign | round_shifted(kept, dropped, shift) as u16
}

/// Rounds `kept` (the value shifted right by `shift`) up when the `dropped` bits are more than
/// half, or exactly half and `kept` is odd.
fn round_shifted(kept: u32, dropped: u32, shift: u32) -> u32 {
    let half = 1u32 << (shift - 1);
    if dropped > half || (dropped == half && kept & 1 == 1) {
        kept + 1
    } else {
        kept
    }
}

/// Widens bfloat16 bits to f32 (exact).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Rounds f32 to bfloat16 bits, to nearest with ties to even; a NaN gives [`CANONICAL_NAN16`].
pub fn f32_to_bf16(f: f32) -> u16 {
    if f.is_nan() {
        return CANONICAL_NAN16;
    }
    let bits = f.to_bits();
    let lsb = (bits >> 16) & 1;
    ((bits + 0x7fff + lsb) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_f16_survives_a_round_trip() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            let back = f32_to_f16(f);
            if f.is_nan() {
                assert_eq!(back, CANONICAL_NAN16, "{h:#x}");
            } else {
                assert_eq!(back, h, "{h:#x} -> {f} -> {back:#x}");
            }
        }
    }

    #[test]
    fn every_bf16_survives_a_round_trip() {
        for b in 0..=u16::MAX {
            let f = bf16_to_f32(b);
            let back = f32_to_bf16(f);
            if f.is_nan() {
                assert_eq!(back, CANONICAL_NAN16, "{b:#x}");
            } else {
                assert_eq!(back, b);
            }
        }
    }

    #[test]
    fn f16_rounding_is_to_nearest_even() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1).
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: ties to even (1 + 2^-9).
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00, "rounds up to infinity");
        assert_eq!(f32_to_f16(2f32.powi(-24)), 0x0001, "smallest subnormal");
        assert_eq!(
            f32_to_f16(2f32.powi(-25)),
            0x0000,
            "half of it ties to even zero"
        );
        assert_eq!(f32_to_f16(3.0 * 2f32.powi(-26)), 0x0001);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
    }

    #[test]
    fn f16_matches_exhaustive_reference_rounding() {
        // For random f32 values the conversion picks the nearest representable binary16.
        let mut x: u32 = 0x1234_5678;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let f = f32::from_bits(x);
            if !f.is_finite() || f.abs() > 65504.0 {
                continue;
            }
            let h = f32_to_f16(f);
            let got = f16_to_f32(h) as f64;
            let down = f16_to_f32(h.wrapping_sub(1)) as f64;
            let up = f16_to_f32(h.wrapping_add(1)) as f64;
            let err = (got - f as f64).abs();
            if h & 0x7fff != 0 && h & 0x7fff != 0x7bff {
                assert!(
                    err <= (down - f as f64).abs() && err <= (up - f as f64).abs(),
                    "{f}: {h:#x}"
                );
            }
        }
    }

    #[test]
    fn bf16_rounding_is_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(
            f32_to_bf16(f32::from_bits(0x3f80_8000)),
            0x3f80,
            "tie to even"
        );
        assert_eq!(
            f32_to_bf16(f32::from_bits(0x3f81_8000)),
            0x3f82,
            "tie to even"
        );
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80, "overflow to infinity");
    }
}
