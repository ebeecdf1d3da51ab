// A codebook encode of x itself, without the division by the block's scale (docs/formats.md, "Encoding and
// decoding"): per block, each midpoint m of the map becomes a threshold T on x, the least float with
// RN(T / s) >= m, so that codebook_encode(T, n, x) == codebook_encode(mids, n, RN(x / s)) for every finite x
// (tests/unit/test_encode_in_x.cpp). The CUDA kernels encode 4-bit states so: a division per element costs a GPU
// more than the search. The AVX-512 kernels compute the same thresholds (kernels/cpu/codebook4-inl.h).
#pragma once
#include <math.h>
#include <stdint.h>

#include "dtype_convert.h"
#include "hd.h"

namespace lbopt {

// The least float >= p (p finite, |p| below FLT_MAX).
LBOPT_HD float float_round_up(double p) {
#if defined(__CUDA_ARCH__)
  return __double2float_ru(p);
#else
  const float f = float(p);
  return double(f) < p ? nextafterf(f, INFINITY) : f;
#endif
}

// Threshold k of a map (midpoints mids, the last +inf) for block scale s > 0. The quotients q with RN(q) >= m are
// q > h, h halfway between m and the float below it; q = h exactly is never x / s of two floats (h needs 25
// significant bits), and h * s is exact in double (49 bits). So RN(x / s) >= m iff x > h * s iff x >= T, the least
// float above h * s.
// Midpoints are finite and non-zero but the last (+inf): a map has no value-0 midpoint (both 4-bit maps' values
// lie on either side of 0 or above it), which the unit test checks.
LBOPT_HD float threshold_in_x(const float* mids, int k, float s) {
  const float m = mids[k];
  if (isinf(m)) return m;
  const float below = bits_float(float_bits(m) + (m > 0.0f ? 0xffffffffu : 1u));  // the float below m
  const double h = 0.5 * (double(below) + double(m));
  return float_round_up(h * double(s));
}

}  // namespace lbopt
