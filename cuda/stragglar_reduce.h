/* Element-wise reduction, exactly as src/reduce computes it on the host (tests/kernel_emulation.rs
 * checks the two against each other, bit for bit):
 *  - integer sums and products wrap (computed in the unsigned twin, so no signed overflow);
 *  - fp16 and bf16 widen to fp32, combine in fp32 in operand order, round once (nearest even),
 *    and a NaN result is the canonical NaN 0x7fff;
 *  - fp32 and fp64 combine in their own precision, in operand order (compile with fmad off);
 *  - float max/min return the number when one operand is NaN, the first operand on a tie;
 *  - integer avg divides the wrapped sum by n, truncating; float avg and premulsum are a
 *    copy-in multiplication by a scalar of the element type. */

#ifndef STRAGGLAR_REDUCE_H_
#define STRAGGLAR_REDUCE_H_

#include "stragglar_device.h"

/* ---- fp16 / bf16 ---- */

/* The NaN every fp16 or bf16 result that is not a number becomes (positive, quiet, all payload
 * bits set), on the GPU, in the emulation and in src/reduce alike: NaN payloads differ between
 * a GPU's cvt and a CPU's arithmetic, so the kernels pin them to one. */
#define SG_CANONICAL_NAN16 ((uint16_t)0x7fffu)

SG_DEVICE float sg_bits_to_f32(uint32_t b) {
  union { uint32_t u; float f; } c;
  c.u = b;
  return c.f;
}

SG_DEVICE float sg_bf16_to_f32(uint16_t b) { return sg_bits_to_f32((uint32_t)b << 16); }

/* Conversions by bit arithmetic, rounding to nearest with ties to even as the GPU's cvt.rn does
 * (src/reduce/float16.rs is the same arithmetic, and tests/kernel_emulation.rs checks every fp16
 * value and a sweep of f32 against it): the host emulation's, and a pre-sm_80 GPU's for bf16.
 * NaN inputs to the narrowing ones never get here (sg_f32_to_f16/bf16 catch them). */

SG_DEVICE uint32_t sg_f32_to_bits(float f) {
  union { uint32_t u; float f; } c;
  c.f = f;
  return c.u;
}

SG_DEVICE uint16_t sg_f32_to_bf16_soft(float f) {
  uint32_t bits = sg_f32_to_bits(f);
  uint32_t lsb = (bits >> 16) & 1u;
  return (uint16_t)((bits + 0x7fffu + lsb) >> 16);
}

#ifdef STRAGGLAR_HOST_EMULATION
SG_DEVICE float sg_f16_to_f32(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
  uint32_t mant = (uint32_t)h & 0x3ffu;
  uint32_t bits;
  if (exp == 0 && mant == 0) {
    bits = sign;
  } else if (exp == 0) {
    /* Subnormal: normalise into f32. */
    uint32_t shift = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++shift;
    }
    bits = sign | ((127u - 15u + 1u - shift) << 23) | ((mant & 0x3ffu) << 13);
  } else if (exp == 0x1f) {
    bits = mant == 0 ? (sign | 0x7f800000u) : (sign | 0x7fc00000u | (mant << 13));
  } else {
    bits = sign | ((exp + 127u - 15u) << 23) | (mant << 13);
  }
  return sg_bits_to_f32(bits);
}

/* Rounds `kept` up when the `dropped` low bits are more than half, or exactly half and odd. */
SG_DEVICE uint32_t sg_round_shifted(uint32_t kept, uint32_t dropped, uint32_t shift) {
  uint32_t half = 1u << (shift - 1);
  return (dropped > half || (dropped == half && (kept & 1u))) ? kept + 1 : kept;
}

SG_DEVICE uint16_t sg_f32_to_f16_rn(float f) {
  uint32_t bits = sg_f32_to_bits(f);
  uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
  int32_t exp = (int32_t)((bits >> 23) & 0xffu);
  uint32_t mant = bits & 0x7fffffu;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00u); /* infinity (NaN is caught before) */
  int32_t unbiased = exp - 127;
  if (unbiased > 15) return (uint16_t)(sign | 0x7c00u);
  if (unbiased >= -14) {
    uint32_t half_bits = ((uint32_t)(unbiased + 15) << 10) | (mant >> 13);
    return (uint16_t)(sign | sg_round_shifted(half_bits, mant & 0x1fffu, 13));
  }
  if (unbiased < -25) return sign;
  uint32_t full = mant | 0x800000u;
  uint32_t shift = (uint32_t)(-14 - unbiased) + 13;
  return (uint16_t)(sign | sg_round_shifted(full >> shift, full & ((1u << shift) - 1), shift));
}

SG_DEVICE uint16_t sg_f32_to_bf16_rn(float f) { return sg_f32_to_bf16_soft(f); }
#else
/* The GPU converts in hardware: one cvt each way (widening is exact, subnormals included;
 * narrowing rounds to nearest, ties to even). bf16 widening is the shift above, and bf16
 * narrowing needs sm_80 (cvt.rn.bf16.f32); older GPUs (sm_70, sm_75) round in software. */
SG_DEVICE float sg_f16_to_f32(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

SG_DEVICE uint16_t sg_f32_to_f16_rn(float f) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

SG_DEVICE uint16_t sg_f32_to_bf16_rn(float f) {
#if __CUDA_ARCH__ >= 800
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  return sg_f32_to_bf16_soft(f);
#endif
}
#endif

/* f32 to fp16 or bf16, rounding to nearest even; a NaN becomes SG_CANONICAL_NAN16 (a select,
 * not a branch: the cvt runs either way). */
SG_DEVICE uint16_t sg_f32_to_f16(float f) {
  return f != f ? SG_CANONICAL_NAN16 : sg_f32_to_f16_rn(f);
}

SG_DEVICE uint16_t sg_f32_to_bf16(float f) {
  return f != f ? SG_CANONICAL_NAN16 : sg_f32_to_bf16_rn(f);
}

/* ---- lanes: how one element type loads, combines and stores ---- */

template <typename A>
SG_DEVICE A sg_fmax(A a, A b) {
  if (a != a) return b;
  if (b != b) return a;
  return b > a ? b : a;
}

template <typename A>
SG_DEVICE A sg_fmin(A a, A b) {
  if (a != a) return b;
  if (b != b) return a;
  return b < a ? b : a;
}

/* An integer type T whose wrapping arithmetic runs in its unsigned twin U; W is the type of
 * T's signedness the division of avg runs in: 32 bits for types up to 32 bits (the quotient of
 * a T by a rank count is the same, and a 64-bit division is a long subroutine on a GPU). */
template <typename T, typename U, typename W>
struct sg_int_lane {
  typedef T elem;
  typedef T acc;
  SG_DEVICE acc widen(elem e) { return e; }
  SG_DEVICE elem narrow(acc a) { return a; }
  SG_DEVICE acc combine(uint32_t op, acc a, acc b) {
    switch (op) {
      case OP_PROD: return (T)((U)a * (U)b);
      case OP_MAX: return b > a ? b : a;
      case OP_MIN: return b < a ? b : a;
      default: return (T)((U)a + (U)b);
    }
  }
  SG_DEVICE acc multiply(acc a, acc b) { return (T)((U)a * (U)b); }
  SG_DEVICE acc finish(uint32_t op, acc a, uint32_t ranks) {
    return op == OP_AVG ? (T)((W)a / (W)ranks) : a;
  }
};

/* A float type combined in its own precision. */
template <typename T>
struct sg_float_lane {
  typedef T elem;
  typedef T acc;
  SG_DEVICE acc widen(elem e) { return e; }
  SG_DEVICE elem narrow(acc a) { return a; }
  SG_DEVICE acc combine(uint32_t op, acc a, acc b) {
    switch (op) {
      case OP_PROD: return a * b;
      case OP_MAX: return sg_fmax(a, b);
      case OP_MIN: return sg_fmin(a, b);
      default: return a + b;
    }
  }
  SG_DEVICE acc multiply(acc a, acc b) { return a * b; }
  SG_DEVICE acc finish(uint32_t, acc a, uint32_t) { return a; }
};

/* fp16 or bf16: stored as 16 bits, accumulated in fp32. */
template <bool BRAIN>
struct sg_half_lane {
  typedef uint16_t elem;
  typedef float acc;
  SG_DEVICE acc widen(elem e) { return BRAIN ? sg_bf16_to_f32(e) : sg_f16_to_f32(e); }
  SG_DEVICE elem narrow(acc a) { return BRAIN ? sg_f32_to_bf16(a) : sg_f32_to_f16(a); }
  SG_DEVICE acc combine(uint32_t op, acc a, acc b) {
    return sg_float_lane<float>::combine(op, a, b);
  }
  SG_DEVICE acc multiply(acc a, acc b) { return a * b; }
  SG_DEVICE acc finish(uint32_t, acc a, uint32_t) { return a; }
};

typedef signed char sg_i8;
typedef unsigned char sg_u8;
typedef long long sg_i64;

typedef sg_int_lane<sg_i8, sg_u8, int32_t> sg_lane_i8;
typedef sg_int_lane<sg_u8, sg_u8, uint32_t> sg_lane_u8;
typedef sg_int_lane<int32_t, uint32_t, int32_t> sg_lane_i32;
typedef sg_int_lane<uint32_t, uint32_t, uint32_t> sg_lane_u32;
typedef sg_int_lane<sg_i64, uint64_t, sg_i64> sg_lane_i64;
typedef sg_int_lane<uint64_t, uint64_t, uint64_t> sg_lane_u64;
typedef sg_half_lane<false> sg_lane_f16;
typedef sg_float_lane<float> sg_lane_f32;
typedef sg_float_lane<double> sg_lane_f64;
typedef sg_half_lane<true> sg_lane_bf16;

/* ncclDataType_t values of the supported types (fp8 stays with NCCL). */
#define SG_DT_I8 0
#define SG_DT_U8 1
#define SG_DT_I32 2
#define SG_DT_U32 3
#define SG_DT_I64 4
#define SG_DT_U64 5
#define SG_DT_F16 6
#define SG_DT_F32 7
#define SG_DT_F64 8
#define SG_DT_BF16 9

/* Calls BODY with LANE bound to the lane of ncclDataType_t `dt`; returns 0 for other types. */
#define SG_WITH_LANE(dt, LANE, BODY)                      \
  switch (dt) {                                           \
    case SG_DT_I8: { typedef sg_lane_i8 LANE; BODY; } break;     \
    case SG_DT_U8: { typedef sg_lane_u8 LANE; BODY; } break;     \
    case SG_DT_I32: { typedef sg_lane_i32 LANE; BODY; } break;   \
    case SG_DT_U32: { typedef sg_lane_u32 LANE; BODY; } break;   \
    case SG_DT_I64: { typedef sg_lane_i64 LANE; BODY; } break;   \
    case SG_DT_U64: { typedef sg_lane_u64 LANE; BODY; } break;   \
    case SG_DT_F16: { typedef sg_lane_f16 LANE; BODY; } break;   \
    case SG_DT_F32: { typedef sg_lane_f32 LANE; BODY; } break;   \
    case SG_DT_F64: { typedef sg_lane_f64 LANE; BODY; } break;   \
    case SG_DT_BF16: { typedef sg_lane_bf16 LANE; BODY; } break; \
    default: break;                                       \
  }

#endif /* STRAGGLAR_REDUCE_H_ */
