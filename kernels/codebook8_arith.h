// The 8-bit dynamic maps' codebook_encode (quant.h) without the 256-entry search: one table read on the float's
// top bits and one compare, bit-identical for every finite float.
//
// A bucket is the 2^16 bit patterns that share a magnitude's exponent and top 7 mantissa bits. Each bucket of a map
// holds at most one of its midpoints (checked below), so a table entry per bucket gives the code below the bucket
// and that midpoint's place in it. Buckets below the first one that holds a midpoint all share one entry, and every
// input with |x| >= 1 is clamped to the float below 1.0, which still lies above the last midpoint: 2.8K entries
// (11 KiB) per map. A negative x on the signed map is its mirror image (the table is symmetric): 254 - (the code
// of |x| with strict compares, so that ties still go up). On the unsigned map negatives give 0.
#pragma once
#include <stdint.h>

#include "codebooks.h"
#include "dtype_convert.h"
#include "hd.h"

namespace lbopt {

namespace encode8_detail {

constexpr uint32_t kClamp = 0x3f7fffffu;  // the float below 1.0
constexpr int kShift = 16;                // a bucket: bits >> kShift
constexpr int32_t kWidth = 1 << kShift;
constexpr int kCodeShift = 20;            // entry = code << kCodeShift | place of the bucket's midpoint
constexpr int32_t kPlaceMask = (1 << kCodeShift) - 1;

constexpr int zero_code(bool is_signed) { return is_signed ? 127 : 0; }

// IEEE bits of a positive normal float at compile time (no constexpr bit_cast in C++17).
constexpr uint32_t bits_of(float f) {
  double x = f;
  int e = 0;
  while (x >= 2.0) x /= 2.0, ++e;
  while (x < 1.0) x *= 2.0, --e;
  return uint32_t(e + 127) << 23 | uint32_t((x - 1.0) * 8388608.0);
}

// The bucket of entry 0 (the one below the first positive midpoint's), and the entries a map needs.
constexpr int32_t first_bucket(const float* mids, bool is_signed) {
  return int32_t(bits_of(mids[zero_code(is_signed)]) >> kShift) - 1;
}
constexpr int32_t bucket_count(const float* mids, bool is_signed) {
  return int32_t(kClamp >> kShift) - first_bucket(mids, is_signed) + 1;
}
constexpr int32_t max_of(int32_t a, int32_t b) { return a > b ? a : b; }
constexpr int kMaxBuckets = max_of(bucket_count(codebook::kSigned8Mids, true),
                                   bucket_count(codebook::kUnsigned8Mids, false));

}  // namespace encode8_detail

struct Encode8Tables {
  int32_t first;    // the bucket of entry 0: every magnitude below it reads entry 0
  int32_t count;    // entries in use
  int32_t is_signed;
  int32_t entry[encode8_detail::kMaxBuckets];  // code << kCodeShift | (midpoint bits - bucket start, or kWidth: none)
};

namespace encode8_detail {

constexpr Encode8Tables make(const float* mids, bool is_signed) {
  Encode8Tables t{};
  t.is_signed = is_signed;
  t.first = first_bucket(mids, is_signed);
  t.count = bucket_count(mids, is_signed);
  int c = zero_code(is_signed);  // codes below: the midpoints under the bucket's start (mids[c] the first positive)
  for (int j = 0; j < t.count; ++j) {
    const uint32_t start = uint32_t(t.first + j) << kShift;
    while (c < 255 && bits_of(mids[c]) < start) ++c;
    const uint32_t m = c < 255 ? bits_of(mids[c]) : 0x7f800000u;
    t.entry[j] = int32_t(c) << kCodeShift | (m - start < uint32_t(kWidth) ? int32_t(m - start) : kWidth);
  }
  return t;
}

// What the construction assumes: sorted midpoints strictly between their values, 0 and 1.0 codes where expected,
// a symmetric signed map, the table's size, no midpoint in entry 0's bucket and at most one in any bucket.
constexpr bool valid(const Encode8Tables& t, const float* values, const float* mids, bool is_signed) {
  const int z = zero_code(is_signed);
  if (values[z] != 0.0f || values[255] != 1.0f || !(mids[255] > 3.4e38f)) return false;
  for (int i = 0; i < 255; ++i)
    if (!(values[i] < mids[i] && mids[i] < values[i + 1])) return false;
  if (is_signed)
    for (int i = 0; i < 254; ++i)
      if (mids[i] != -mids[253 - i]) return false;
  if (t.first < 0 || !(bits_of(mids[254]) < kClamp)) return false;
  if ((t.entry[0] & kPlaceMask) != kWidth) return false;
  for (int c = z; c < 254; ++c)
    if ((bits_of(mids[c]) >> kShift) == (bits_of(mids[c + 1]) >> kShift)) return false;
  return true;
}

}  // namespace encode8_detail

LBOPT_TABLE Encode8Tables kEncode8Signed = encode8_detail::make(codebook::kSigned8Mids, true);
LBOPT_TABLE Encode8Tables kEncode8Unsigned = encode8_detail::make(codebook::kUnsigned8Mids, false);
static_assert(encode8_detail::valid(kEncode8Signed, codebook::kSigned8Values, codebook::kSigned8Mids, true),
              "signed 8-bit map: bucket encode preconditions fail");
static_assert(encode8_detail::valid(kEncode8Unsigned, codebook::kUnsigned8Values, codebook::kUnsigned8Mids, false),
              "unsigned 8-bit map: bucket encode preconditions fail");

// codebook_encode(mids, 256, y) for the map of t, for every finite y (and +-Inf).
LBOPT_HD uint32_t codebook8_encode_arith(const Encode8Tables& t, float y) {
  using namespace encode8_detail;
  const uint32_t bits = float_bits(y);
  const int32_t neg = int32_t(bits) >> 31;  // -1 or 0
  const uint32_t mag = bits & 0x7fffffffu;
  const int32_t a = int32_t(mag < kClamp ? mag : kClamp);
  const int32_t bucket = a >> kShift;
  const int32_t e = t.entry[bucket > t.first ? bucket - t.first : 0];
  // the place in the bucket, + 1 for y >= 0: "> midpoint" is ">=" for y >= 0 and ">" for y < 0 (ties toward 0)
  const int32_t place = (a & (kWidth - 1)) + 1 + neg;
  const int32_t p = (e >> kCodeShift) + (place > (e & kPlaceMask) ? 1 : 0);
  if (!t.is_signed) return neg ? 0u : uint32_t(p);
  const int32_t code = (p ^ neg) + (neg & 255);  // y < 0: 254 - p; p = 255 (|y| past the last midpoint) gives -1
  return uint32_t(code > 0 ? code : 0);
}

}  // namespace lbopt
