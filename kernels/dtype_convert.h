// Scalar float <-> bfloat16 / float16 conversions and the counter-based random bits of stochastic rounding,
// shared by the CPU and CUDA backends so both round parameters bit-identically.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "hd.h"

namespace lbopt {

LBOPT_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

LBOPT_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

LBOPT_HD float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN instead of rounding into Inf.
LBOPT_HD uint16_t float_to_bf16(float f) {
  uint32_t b = float_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t((b >> 16) | 0x40u);
  b += 0x7fffu + ((b >> 16) & 1u);
  return uint16_t(b >> 16);
}

// Unbiased stochastic rounding (torchao's rule): round away from the truncated value iff r < the 16 dropped
// bits, with r uniform in [0, 2^16). E[result] = f.
LBOPT_HD uint16_t float_to_bf16_stochastic(float f, uint32_t r16) {
  uint32_t b = float_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t((b >> 16) | 0x40u);
  return uint16_t((b >> 16) + ((r16 & 0xffffu) < (b & 0xffffu) ? 1u : 0u));
}

LBOPT_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24 is exact in float
    const float mag = float(mant) * 5.9604644775390625e-08f;
    return sign ? -mag : mag;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even, overflow to Inf, NaN stays NaN.
LBOPT_HD uint16_t float_to_f16(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds past the largest half
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal half, mantissa = |f| * 2^24 rounded to nearest even
    return uint16_t(sign | uint16_t(rintf(bits_float(ax) * 16777216.0f)));
  }
  uint32_t r = ax - 0x38000000u;  // rebias the exponent from 127 to 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

// Counter-based random bits keyed by (seed, step, element index): the same bits on every backend and thread
// split, so stochastic rounding is reproducible. SplitMix64's finalizer mixes the combined counter.
LBOPT_HD uint32_t random_bits(uint64_t seed, uint64_t step, uint64_t index) {
  uint64_t z = seed ^ (step * 0x9E3779B97F4A7C15ull);
  z += (index + 1) * 0xD1B54A32D192ED03ull;
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return uint32_t(z);
}

}  // namespace lbopt
