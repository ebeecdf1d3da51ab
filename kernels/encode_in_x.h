// The 4-bit encode of x itself, without the division by the block's scale s (docs/formats.md, "Encoding and
// decoding"): per block, each midpoint m of the map becomes a threshold T on x, the least float with
// RN(T / s) >= m, so that the count of thresholds <= x is the code of RN(x / s) for every finite x. A candidate
// code from x times a per-block factor r, within one of the code, and one compare with a threshold settle it
// (encode_signed_in_x, encode_linear_in_x; tests/unit/test_encode_in_x.cpp checks them against the division and
// search of quant.h's Codec). The CUDA kernels built with gpu_encode_in_x or gpu_wide_step encode 4-bit states so
// (docs/benchmarks.md, "GPU kernel choices"); the AVX-512 kernels do the same with vectors
// (kernels/cpu/codebook4-inl.h).
#pragma once
#include <math.h>
#include <stdint.h>

#include "codebooks.h"
#include "dtype_convert.h"
#include "hd.h"

namespace lbopt {

namespace encode4 {
// What the fold assumes of the signed map: code 7 is 0, mids[k] = -mids[13 - k] below code 14, and the midpoints
// from mids[7] on are positive and ascending (the search compares their bits as integers).
constexpr bool signed_map_folds() {
  const float* m = codebook::kSigned4Mids;
  if (codebook::kSigned4Values[7] != 0.0f || !(m[7] > 0.0f)) return false;
  for (int k = 0; k < 14; ++k)
    if (m[k] != -m[13 - k]) return false;
  for (int k = 7; k < 14; ++k)
    if (!(m[k] < m[k + 1])) return false;
  return true;
}
static_assert(signed_map_folds(), "the signed 4-bit map is not symmetric about its zero code");
// What the linear encodes assume of the unsigned map: values (k + 1) / 16 and midpoints (2 k + 3) / 32.
constexpr bool unsigned_map_is_linear() {
  for (int k = 0; k < 16; ++k)
    if (codebook::kUnsigned4Values[k] != float(k + 1) / 16.0f ||
        (k < 15 && codebook::kUnsigned4Mids[k] != float(2 * k + 3) / 32.0f))
      return false;
  return true;
}
static_assert(unsigned_map_is_linear(), "the unsigned 4-bit map is not k/16");

// The signed map's candidates. Bucket j holds the a = |x| r + 2^-8 (r = RN(kBucketC / s)) whose float bits have
// (bits >> 21) % 32 == j: the exponent's low 3 bits and 2 mantissa bits, for a in [2^-8, 1), where kBucketC
// keeps a below 1. a is within 2^-22 + 2^-25 of a* = (|x| / s) kBucketC + 2^-8: r errs by at most about 2^-22
// relative even where it is subnormal (s >= 2^126), the sum by 2^-25. So a midpoint m whose a*(m) lies more than
// kBucketMargin outside a's bucket is more than 2^-25 from |x| / s, and RN(|x| / s) lies on the same side of m.
// The table holds 8 + the count of midpoints below the bucket by that margin; at most one other (checked below)
// lies in or near the bucket, and one threshold compare settles it.
constexpr double kBucketC = 1.0 - 0x1p-8 - 0x1p-20;  // a float: 20 significant bits
constexpr double kBucketMargin = 0x1p-21;
struct SignedBuckets {
  int32_t first[32] = {};  // 8 + the positive midpoints (of mids[7..14]) surely below bucket j
  bool one_per_bucket = true;
};
constexpr SignedBuckets signed_buckets() {
  SignedBuckets b;
  double p = 0x1p-8;  // 2^(e - 127) for the float exponents e = 119 .. 126
  for (int e = 119; e < 127; ++e, p *= 2) {
    for (int q = 0; q < 4; ++q) {
      const double low = p * (1 + q / 4.0), high = low + p / 4;
      int below = 0, near = 0;
      for (int k = 7; k < 15; ++k) {
        const double a = double(codebook::kSigned4Mids[k]) * kBucketC + 0x1p-8;
        below += a < low - kBucketMargin;
        near += a >= low - kBucketMargin && a < high + kBucketMargin;
      }
      b.first[((e << 2) | q) & 31] = 8 + below;
      if (near > 1) b.one_per_bucket = false;
    }
  }
  return b;
}
static_assert(signed_buckets().one_per_bucket, "a bucket of the signed 4-bit map holds two midpoints");
static_assert(double(float(kBucketC)) == kBucketC, "kBucketC is a float");
alignas(64) inline constexpr SignedBuckets kSignedBuckets = signed_buckets();
}  // namespace encode4

// The least float >= p (p finite, |p| below FLT_MAX).
inline float float_round_up(double p) {
  const float f = float(p);
  return double(f) < p ? nextafterf(f, INFINITY) : f;
}

// The float below m (finite, non-zero).
LBOPT_HD float float_below(float m) { return bits_float(float_bits(m) + (m > 0.0f ? 0xffffffffu : 1u)); }

// The point h below midpoint m (finite, non-zero) where the quotients q with RN(q) >= m begin: q > h, h halfway
// between m and the float below it. q = h exactly is never x / s of two floats (h needs 25 significant bits), and
// h * s is exact in double (49 bits) for any float s.
inline double midpoint_in_quotients(float m) { return 0.5 * (double(float_below(m)) + double(m)); }

// h * s as below * s + tail for one fused multiply-add rounded up: m - below is a power of two, so h = below +
// (m - below) / 2 exactly and tail = ((m - below) / 2) * s is exact (no underflow for the 4-bit maps' midpoints and
// s >= 1e-12, which the unit test checks). The GPU's threshold, without double arithmetic.
struct ThresholdTerms {
  float below, tail;
};
LBOPT_HD ThresholdTerms threshold_terms(float m, float s) {
  const float below = float_below(m);
  return {below, (m - below) * 0.5f * s};
}

// The threshold of midpoint m (finite, non-zero) for block scale s >= 1e-12: RN(x / s) >= m iff x > h * s iff
// x >= T, the least float above h * s.
LBOPT_HD float threshold_of_midpoint(float m, float s) {
#if defined(__CUDA_ARCH__)
  const ThresholdTerms t = threshold_terms(m, s);
  return __fmaf_ru(t.below, s, t.tail);
#else
  return float_round_up(midpoint_in_quotients(m) * double(s));
#endif
}

// A block's row, as the encodes below read it, the same for both maps: entry 0 -inf, entry k + 1 the threshold T_k
// of midpoint k = 0..14, entry 16 +inf (the unsigned map's T_15), entry 17 the candidate factor r. Entries 0 and 16
// are fixed; value k of a block of scale s (in_x_value: T_k for k < 15, r for k = 15) goes to entry in_x_entry(k):
// 16 values a map and block, which a GPU warp computes for two states at once.
constexpr int kInXRow = 18;
LBOPT_HD float in_x_factor(bool linear, float s) {  // linear: the unsigned map
  return (linear ? 16.0f : float(encode4::kBucketC)) / s;  // one rounding: within r's bounds below
}
// Computed without a branch, so that the 16 lanes of a GPU half-warp that compute a row do not diverge: value 15
// also computes a threshold (of midpoint 14), not kept. The midpoints are finite and non-zero (mids[15], +inf, is
// never read): a map has no value-0 midpoint, which the unit test checks.
LBOPT_HD float in_x_value(const float* mids, bool linear, int k, float s) {
  const float t = threshold_of_midpoint(mids[k < 15 ? k : 14], s);
  const float r = in_x_factor(linear, s);
  return k < 15 ? t : r;
}
LBOPT_HD int in_x_entry(int k) { return k < 15 ? k + 1 : 17; }
LBOPT_HD void in_x_fixed_entries(float* row) {
  row[0] = -INFINITY;
  row[16] = INFINITY;
}

// The signed map's code of x (finite, |x| <= s) from its block's row and the bucket table: a = |x| r + 2^-8 gives
// c = 8 + n for x >= 0 and 7 - n for x < 0, n the positive midpoints surely below a's bucket; the code is c or
// c - 1, and T_(c-1) (-inf for c = 0) settles which.
LBOPT_HD uint32_t encode_signed_in_x(float x, const float* row, const int32_t* first) {
  const float a = fmaf(fabsf(x), row[17], 0x1p-8f);
  int32_t c = first[(float_bits(a) >> 21) & 31];
  if (float_bits(x) >> 31) c = 15 - c;
  return uint32_t(c - (x < row[c] ? 1 : 0));
}

// The unsigned map's code of x (finite, |x| <= s) from its block's row: the map (k + 1) / 16 has the code
// max(0, floor(w)) of y = RN(x / s), w = 16 y - 0.5. z = RN(x r - 0.5 - 2^-16) lies in (w - 2^-15, w): r, y and z
// each err by at most 2^-20 for |x| <= s, under the 2^-16 taken off. So c = max(0, trunc(z)) is the code or one
// below it, and x >= T_c (T_15 = +inf) settles which; for x < 0, c = 0 and T_0 > 0 > x.
LBOPT_HD uint32_t encode_linear_in_x(float x, const float* row) {
  const float z = fmaf(x, row[17], -0.5f - 0x1p-16f);
  const int32_t c = z > 0.0f ? int32_t(z) : 0;
  return uint32_t(c + (row[c + 1] <= x ? 1 : 0));
}

}  // namespace lbopt
