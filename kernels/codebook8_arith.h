// The 8-bit dynamic maps' codebook_encode (quant.h) without the 256-entry search: a code computed from the
// float's bits and one compare against the real midpoint table, bit-identical for every finite float.
//
// Positive a: region r = (zero code) or (decade k, r = k + 1) or (decade 6 and the code of 1.0, r = 7), estimated
// from a piecewise-linear log10 of the bits and settled by one compare with the region's first midpoint. Within a
// region the codes are evenly spaced, so a line G(a) rounded to nearest gives a candidate c within one below the
// answer; mids[c] <= a settles it. A negative x on the signed map is its mirror image (the table is symmetric):
// 254 - (the code of |x| with strict compares, so that ties still go up). On the unsigned map negatives give 0.
// Every input with |x| >= 1 is clamped to the float below 1.0, which still lies above the last midpoint.
#pragma once
#include <stdint.h>

#include "codebooks.h"
#include "dtype_convert.h"
#include "hd.h"

namespace lbopt {

// Per-region constants of one map. Entries 8..15 repeat entry 7 so that a 16-lane vector loads a whole table.
struct Encode8Tables {
  float mul[16];      // candidate = round_nearest(a * mul[r] + add[r])
  float add[16];
  int32_t next[16];   // bits of region r + 1's first midpoint (INT32_MAX after the last region)
  const float* mids;  // the map's 256 midpoints, as codebook_encode reads them (a device copy on the GPU)
  int32_t is_signed;
};

namespace encode8_detail {

constexpr int kRegions = 8;
constexpr uint32_t kClamp = 0x3f7fffffu;  // the float below 1.0
constexpr float kRound = 12582912.0f;     // 1.5 * 2^23: x + kRound has round_nearest(x) in its low bits
constexpr int32_t kRoundBits = 0x4b400000;
// Region estimate round_nearest(bits * kEstMul + kEstAdd), i.e. floor(log10(a) + 8 - 0.7) with log10 taken
// from the bits (exact at powers of 2, at most 0.026 low between): each region spans one decade from a first
// midpoint 0.006 .. 0.44 decades above 10^(r-8), so the estimate is r or r - 1 (checked below).
constexpr float kEstMul = float(0.30102999566398120 / 8388608.0);
constexpr float kEstAdd = float(8.0 - 127.0 * 0.30102999566398120 - 0.7 - 0.5);

// IEEE bits of a non-negative normal float or zero, at compile time (no constexpr bit_cast in C++17).
constexpr int32_t bits_of(float f) {
  if (f == 0.0f) return 0;
  double x = f;
  int e = 0;
  while (x >= 2.0) x /= 2.0, ++e;
  while (x < 1.0) x *= 2.0, --e;
  return int32_t(uint32_t(e + 127) << 23) | int32_t((x - 1.0) * 8388608.0);
}

constexpr int zero_code(bool is_signed) { return is_signed ? 127 : 0; }
// First code and code count of region r: the dynamic map's decade k = r - 1 holds 2^k (signed) or 2^(k+1)
// (unsigned) values above its zero code; region 7 also holds 255 (1.0).
constexpr int region_first(bool is_signed, int r) {
  int f = zero_code(is_signed);
  for (int q = 0; q < r; ++q) f += q == 0 ? 1 : (is_signed ? 1 << (q - 1) : 2 << (q - 1));
  return f;
}
constexpr int region_count(bool is_signed, int r) {
  if (r == 0) return 1;
  return (r == kRegions - 1 ? 256 : region_first(is_signed, r + 1)) - region_first(is_signed, r);
}

constexpr Encode8Tables make(const float* values, const float* mids, bool is_signed) {
  Encode8Tables t{};
  t.mids = mids;
  t.is_signed = is_signed;
  for (int r = 0; r < kRegions; ++r) {
    const int f = region_first(is_signed, r);
    const int n = region_count(is_signed, r) - (r == kRegions - 1 ? 1 : 0);  // the decade's own codes
    double mul = 0.0, add = f;  // the zero region and a one-code decade: the candidate is the first code
    if (n >= 2) {
      // u: position among the decade's codes, value j at j + 0.5, midpoints near the integers; the next region
      // starts near u = n + 1. floor(f + (1 - 0.5/n) u - 0.5) is the answer or one below, with a margin of 0.5/n;
      // in the last region the code of 1.0 starts near u = n - 0.25 and floor(f + u - 0.5) keeps a margin of 1/4.
      const double slope = (n - 1) / (double(values[f + n - 1]) - double(values[f]));
      const double shrink = r == kRegions - 1 ? 1.0 : 1.0 - 0.5 / n;
      mul = shrink * slope;
      add = f + shrink * (0.5 - double(values[f]) * slope) - 0.5 - 0.5;  // - 0.5: floor from round-to-nearest
    }
    t.mul[r] = float(mul);
    t.add[r] = float(add);
    t.next[r] = r + 1 < kRegions ? bits_of(mids[region_first(is_signed, r + 1) - 1]) : INT32_MAX;
  }
  for (int r = kRegions; r < 16; ++r)
    t.mul[r] = t.mul[kRegions - 1], t.add[r] = t.add[kRegions - 1], t.next[r] = t.next[kRegions - 1];
  return t;
}

// Compile-time proof obligations, with a margin far above float rounding (about 2e-5 here): the map is what the
// construction above assumes, every region estimate is r or r - 1, every candidate is the answer or one below.
constexpr double kMargin = 1e-3;
constexpr double est_of(int32_t bits) { return double(bits) * double(kEstMul) + double(kEstAdd); }
constexpr bool valid(const Encode8Tables& t, const float* values, const float* mids, bool is_signed) {
  const int z = zero_code(is_signed);
  if (values[z] != 0.0f || values[255] != 1.0f || !(mids[255] > 3.4e38f)) return false;
  for (int i = 0; i < 255; ++i)
    if (!(values[i] < mids[i] && mids[i] < values[i + 1])) return false;
  if (is_signed)
    for (int i = 0; i < 254; ++i)
      if (mids[i] != -mids[253 - i]) return false;
  for (int r = 0; r < kRegions; ++r) {
    const int f = region_first(is_signed, r), last = f + region_count(is_signed, r) - 1;
    // region r is [mids[f - 1], mids[last]) (strict compares: (.., ..]); its estimate must be r - 1 or r
    const double lo = r == 0 ? 0.0 : double(mids[f - 1]);
    const double hi = r == kRegions - 1 ? 1.0 : double(mids[last]);
    if (r > 0 && !(est_of(bits_of(float(lo))) > r - 1.5 + kMargin)) return false;
    if (!(est_of(r == kRegions - 1 ? int32_t(kClamp) : bits_of(float(hi))) < r + 0.5 - kMargin)) return false;
    for (int c = f; c <= last; ++c) {
      // code c's bin [mids[c - 1], mids[c]] clipped to the region: candidate rounds to c - 1 or c at both ends
      const double b0 = c == f ? lo : double(mids[c - 1]);
      const double b1 = c == last ? hi : double(mids[c]);
      if (!(b0 * t.mul[r] + t.add[r] > c - 1.5 + kMargin)) return false;
      if (!(b1 * t.mul[r] + t.add[r] < c + 0.5 - kMargin)) return false;
    }
  }
  return true;
}

}  // namespace encode8_detail

LBOPT_TABLE Encode8Tables kEncode8Signed =
    encode8_detail::make(codebook::kSigned8Values, codebook::kSigned8Mids, true);
LBOPT_TABLE Encode8Tables kEncode8Unsigned =
    encode8_detail::make(codebook::kUnsigned8Values, codebook::kUnsigned8Mids, false);
static_assert(encode8_detail::valid(kEncode8Signed, codebook::kSigned8Values, codebook::kSigned8Mids, true),
              "signed 8-bit map: arithmetic encode preconditions fail");
static_assert(encode8_detail::valid(kEncode8Unsigned, codebook::kUnsigned8Values, codebook::kUnsigned8Mids, false),
              "unsigned 8-bit map: arithmetic encode preconditions fail");

// round_nearest(x) for |x| < 2^22, by the float adder (no conversion instruction, no libm)
LBOPT_HD int32_t encode8_round(float x) {
  return int32_t(float_bits(x + encode8_detail::kRound)) - encode8_detail::kRoundBits;
}

// codebook_encode(t.mids, 256, y) for the map of t, for every finite y (and +-Inf).
LBOPT_HD uint32_t codebook8_encode_arith(const Encode8Tables& t, float y) {
  using namespace encode8_detail;
  const uint32_t bits = float_bits(y);
  const int32_t neg = int32_t(bits) >> 31;  // -1 or 0
  const uint32_t mag = bits & 0x7fffffffu;
  const int32_t a = int32_t(mag < kClamp ? mag : kClamp);
  // a_cmp > bits(m) is a >= m for y >= 0 and a > m for y < 0 (ties of a negative y go toward 0)
  const int32_t a_cmp = a + 1 + neg;
  int32_t est = encode8_round(float(a) * kEstMul + kEstAdd);
  est = est > 0 ? est : 0;
  const int32_t r = est + (a_cmp > t.next[est] ? 1 : 0);
  const int32_t c = encode8_round(bits_float(uint32_t(a)) * t.mul[r] + t.add[r]);
  const int32_t p = c + (a_cmp > int32_t(float_bits(t.mids[c])) ? 1 : 0);
  if (!t.is_signed) return neg ? 0u : uint32_t(p);
  const int32_t code = (p ^ neg) + (neg & 255);  // y < 0: 254 - p; p = 255 (|y| past the last midpoint) gives -1
  return uint32_t(code > 0 ? code : 0);
}

}  // namespace lbopt
