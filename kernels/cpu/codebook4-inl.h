// Per-target vector forms of quant.h's codebook_encode for the two 4-bit maps, bit-identical to it for every
// quotient y = x / s of a block (|y| <= 1; the unsigned map's codes <= 0 for y < 0 are clamped by the packers;
// tests/cpu/test_codebook4_simd.cpp checks every float with |y| <= 2). Include it after
// <hwy/highway.h> at file scope of a foreach_target source (outside any namespace); it defines
// lbopt::cpu::HWY_NAMESPACE::Encode4Signed and Encode4Linear (codes of the divided value y = x / s), and on
// AVX-512 Thresholds4 (the code of x itself, with no division; tests/cpu/test_simd.cpp checks it against the
// portable kernels at many block scales).
//
// Why not the generic 16-entry binary search: each of its four steps is a permute that waits on the last compare,
// and a 16-entry table costs two permutes and a blend on AVX2. The signed map is symmetric about its zero code
// (its one unpaired code is 1.0 at the top), so a 3-step search over its 7 inner positive midpoints, on the bits
// of |y|, plus one compare against the top midpoint settles both signs: 8-entry tables, one permute per step.
// AVX2 goes further: a byte shuffle reads how many of those midpoints lie below |y|'s half-binade bucket, and one
// compare settles the code (kSignedByteBuckets). The unsigned map is k/16 and needs no table at all. AVX-512
// holds 16 entries in a register and has no need of the fold; it drops the division instead (Thresholds4).
#if defined(LBOPT_KERNELS_CPU_CODEBOOK4_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LBOPT_KERNELS_CPU_CODEBOOK4_INL_H_
#undef LBOPT_KERNELS_CPU_CODEBOOK4_INL_H_
#else
#define LBOPT_KERNELS_CPU_CODEBOOK4_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/codebooks.h"
#include "kernels/dtype_convert.h"
#include "kernels/encode_in_x.h"

#include <math.h>

#ifndef LBOPT_CODEBOOK4_TABLES_ONCE
#define LBOPT_CODEBOOK4_TABLES_ONCE
namespace lbopt::encode4 {
// The probe tables of Encode4Signed's search over the bits of mids[7..13] (positions p = 0..6), each less one: the
// first probe is position 3; the second, at code c in {0, 4}, is position c + 1; the third, at c in {0, 2, 4, 6},
// position c. Padded to 16 entries, so that a 16-lane vector loads a whole table.
struct SignedTables {
  alignas(64) int32_t second[16];
  alignas(64) int32_t third[16];
  int32_t first, top;  // bits of mids[10] and mids[14], less one
  SignedTables() {
    const auto bits = [](int p) { return int32_t(float_bits(codebook::kSigned4Mids[7 + p])) - 1; };
    for (int c = 0; c < 16; ++c) {
      second[c] = bits(c < 4 ? 1 : 5);
      third[c] = bits(c & 6);
    }
    first = bits(3);
    top = bits(7);
  }
};
inline const SignedTables kSignedTables;

// Encode4Signed's AVX2 form. a = RN(|y| kByteC + 2^-7), for |y| <= 2, lies in [2^-7, 2), where bits 22-25 of its
// float (the exponent's low 3 bits and the top mantissa bit) number 16 buckets, each half a binade; for |y| <= 1
// the buckets 0 .. 13. a is monotonic in |y| (one rounding of an affine map), so a midpoint m whose A(m) = a(m)
// lies below bucket j is <= every |y| in it, and one above it is > every |y| there: count[j] holds the midpoints
// of mids[7..14] with A(m) below bucket j (at most 7), and the one A(m) that may lie in the bucket is mids[7 +
// count[j]], which one compare settles. kByteC is chosen so that no bucket holds two (checked below). The encode
// computes a 2^-64 instead (the same rounding: no operand is subnormal), whose exponents 56 .. 63 leave bit 29
// clear, so that the byte shuffle's index byte (bits 22-29) needs no mask.
constexpr float kByteC = 0.875f;
constexpr float kByteOffset = 0x1p-7f;
constexpr float kByteUnit = 0x1p-64f;  // a's scale in the encode
struct SignedByteBuckets {
  alignas(16) uint8_t count[16] = {};
  alignas(32) int32_t mid_bits[8] = {};  // bits of mids[7 + c], less one
  bool one_per_bucket = true;
};
constexpr SignedByteBuckets signed_byte_buckets() {
  SignedByteBuckets b;
  // A(m) as the fused multiply-add rounds it: m kByteC + 2^-7 is exact in double, and one conversion rounds it
  double a[8] = {};
  for (int k = 0; k < 8; ++k) {
    a[k] = double(float(double(codebook::kSigned4Mids[7 + k]) * double(kByteC) + double(kByteOffset)));
    b.mid_bits[k] = int32_t(__builtin_bit_cast(uint32_t, codebook::kSigned4Mids[7 + k])) - 1;
  }
  if (!(double(kByteC) * 2 + double(kByteOffset) < 2.0)) b.one_per_bucket = false;  // a for |y| <= 2 below 2
  for (int j = 0; j < 16; ++j) {
    double p = double(kByteOffset);  // the binade of exponent 120 + j / 2
    for (int e = 0; e < j / 2; ++e) p *= 2;
    const double low = p * (1 + (j & 1) / 2.0), high = low + p / 2;
    int below = 0, in = 0;
    for (int k = 0; k < 8; ++k) {
      below += a[k] < low;
      in += a[k] >= low && a[k] < high;
    }
    if (in > 1) b.one_per_bucket = false;
    b.count[j] = uint8_t(below < 7 ? below : 7);  // all 8 below: the compare with mids[14] adds the eighth
  }
  return b;
}
static_assert(signed_byte_buckets().one_per_bucket, "a byte bucket of the signed 4-bit map holds two midpoints");
alignas(32) inline constexpr SignedByteBuckets kSignedByteBuckets = signed_byte_buckets();
static_assert(kSignedByteBuckets.count[0] == 0, "Encode4Signed's byte shuffle needs count[0] = 0");

// Thresholds4's per-map constants: lane k holds midpoint k - shift's h (midpoint_in_quotients), -inf below
// midpoint 0.
struct MidsInX {
  alignas(64) double h[16];
  MidsInX(const float* mids, int shift) {
    for (int k = 0; k < 16; ++k) {
      const int i = k - shift;  // mids[15] is +inf: never reached by a finite x
      h[k] = i < 0 ? double(-INFINITY) : i == 15 ? double(mids[i]) : midpoint_in_quotients(mids[i]);
    }
  }
};
inline const MidsInX kSigned4InX(codebook::kSigned4Mids, 1), kUnsigned4InX(codebook::kUnsigned4Mids, 0);

}  // namespace lbopt::encode4
#endif  // LBOPT_CODEBOOK4_TABLES_ONCE

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 16 floats (a 4-bit codebook), padded to a whole vector of any width.
struct Table16 {
  static constexpr int kPad = HWY_MAX_BYTES / 4 > 16 ? HWY_MAX_BYTES / 4 : 16;
  HWY_ALIGN float t[kPad];
  // t[c] = src[c + shift], the last entry repeated past the end
  void fill(const float* src, int shift = 0) {
    for (int c = 0; c < kPad; ++c) t[c] = src[c + shift < 15 ? c + shift : 15];
  }
};

// tab[index & 15]: one register permute where a vector holds 16 floats (AVX-512), two and a select where it holds
// 8 (AVX2), a gather on narrower vectors. The table is read as a memory operand of the permute. On x86 the bits
// above the low 4 cost nothing: the permutes read only the low bits, and AVX2's select reads bit 3 as a sign.
HWY_INLINE hn::Vec<hn::ScalableTag<float>> lookup16(const Table16& tab, hn::Vec<hn::ScalableTag<int32_t>> index) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return hn::Vec<decltype(df)>{_mm512_permutexvar_ps(index.raw, hn::Load(df, tab.t).raw)};
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  const auto low = _mm256_permutevar8x32_ps(hn::Load(df, tab.t).raw, index.raw);
  const auto high = _mm256_permutevar8x32_ps(hn::Load(df, tab.t + 8).raw, index.raw);
  return hn::Vec<decltype(df)>{_mm256_blendv_ps(low, high, _mm256_castsi256_ps(hn::ShiftLeft<28>(index).raw))};
#endif
  index = hn::And(index, hn::Set(di, 15));
  const size_t n = hn::Lanes(df);
  if (n >= 16) return hn::TableLookupLanes(hn::Load(df, tab.t), hn::IndicesFromVec(df, index));
  if (n == 8) {
    const auto lane = hn::IndicesFromVec(df, hn::And(index, hn::Set(di, 7)));
    const auto high = hn::RebindMask(df, hn::Gt(index, hn::Set(di, 7)));
    return hn::IfThenElse(high, hn::TableLookupLanes(hn::Load(df, tab.t + 8), lane),
                          hn::TableLookupLanes(hn::Load(df, tab.t), lane));
  }
  return hn::GatherIndex(df, tab.t, index);
}

namespace encode4 {
// t[index] for index < 8 from a table padded to 16 entries: one permute on AVX2 and AVX-512, a gather elsewhere.
template <class DI>
HWY_INLINE hn::Vec<DI> Lookup8(DI di, const int32_t* t, hn::Vec<DI> index) {
  const size_t n = hn::Lanes(di);
  if (n == 8 || n == 16) return hn::TableLookupLanes(hn::Load(di, t), hn::IndicesFromVec(di, index));
  return hn::GatherIndex(di, t, index);
}

// v + k where mask: a masked add on AVX-512, the mask vector (-1 where set) subtracted or masked elsewhere.
template <class DI, class M>
HWY_INLINE hn::Vec<DI> AddIf(DI di, M mask, hn::Vec<DI> v, int32_t k) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return hn::IfThenElse(mask, hn::Add(v, hn::Set(di, k)), v);
#else
  const auto ones = hn::VecFromMask(di, mask);  // -1 where mask
  return k == 1 ? hn::Sub(v, ones) : hn::Add(v, hn::And(ones, hn::Set(di, k)));
#endif
}

// x86's conversions and sign ops on the vector widths the encodes run at; Highway's forms add range fix-ups.
// trunc(v) for |v| < 2^31.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> TruncInRange(DF, hn::Vec<DF> v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  if constexpr (sizeof(v.raw) == 64) return {_mm512_cvttps_epi32(v.raw)};
  if constexpr (sizeof(v.raw) == 32) return {_mm256_cvttps_epi32(v.raw)};
  if constexpr (sizeof(v.raw) == 16) return {_mm_cvttps_epi32(v.raw)};
#endif
  return hn::ConvertTo(hn::RebindToSigned<DF>(), v);
}

// c negated where bits < 0: one psign on AVX2 and narrower x86 vectors (which also zeroes c where bits = 0, where
// Encode4Signed's c is 0 already).
template <class DI>
HWY_INLINE hn::Vec<DI> SignOf(DI, hn::Vec<DI> c, hn::Vec<DI> bits) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  if constexpr (sizeof(c.raw) == 32) return {_mm256_sign_epi32(c.raw, bits.raw)};
  if constexpr (sizeof(c.raw) == 16) return {_mm_sign_epi32(c.raw, bits.raw)};
#endif
  const auto neg = hn::ShiftRight<31>(bits);
  return hn::Sub(hn::Xor(c, neg), neg);
}
}  // namespace encode4

// codebook_encode(kSigned4Mids, 16, y) per lane. With y >= 0 the code is 7 plus the count of positive midpoints
// <= y; with y < 0 it is 7 minus the count of positive midpoints < |y| (ties go up), 0 at the least. The two
// compares become one, a > bits(m) - 1 on a = the bits of |y| less one for y < 0; the top midpoint is compared
// with y's bits as a signed integer, which a negative y never passes, so that 7 - c needs no clamp.
//
// On x86 256-bit vectors a byte shuffle reads the count of midpoints below y's bucket (kSignedByteBuckets) and one
// compare with the next midpoint settles the code: one permute, where the search takes two and more
// instructions, each waiting on the last compare (docs/benchmarks.md, "CPU loop choices": signed 4-bit encode).
// Its code for y < -mids[14] is -1, not 0: the AVX2 packer saturates it to 0.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> Encode4Signed(DF, hn::Vec<DF> y) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  if constexpr (sizeof(y.raw) == 32) {
    const lbopt::encode4::SignedByteBuckets& t = lbopt::encode4::kSignedByteBuckets;
    const __m256i bits = _mm256_castps_si256(y.raw);
    const __m256i mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    using lbopt::encode4::kByteUnit;
    const __m256 a = _mm256_fmadd_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(lbopt::encode4::kByteC * kByteUnit),
                                     _mm256_set1_ps(lbopt::encode4::kByteOffset * kByteUnit));
    // the index byte's bits 4-6 are ignored and its bit 7 is clear; bytes 1-3 of each lane are 0 and read count[0]
    // = 0, so c is the count itself
    const __m256i bucket = _mm256_srli_epi32(_mm256_castps_si256(a), 22);
    const __m256i c = _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(t.count))), bucket);
    // |y|'s bits, less one for y < 0: > bits(m) - 1 is |y| >= m for y >= 0 and |y| > m for y < 0 (ties go up)
    const __m256i key = _mm256_add_epi32(mag, _mm256_srai_epi32(bits, 31));
    const __m256i mids = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.mid_bits));
    const __m256i mid = _mm256_permutevar8x32_epi32(mids, c);
    const __m256i n = _mm256_sub_epi32(c, _mm256_cmpgt_epi32(key, mid));
    return {_mm256_add_epi32(_mm256_sign_epi32(n, bits), _mm256_set1_epi32(7))};
  }
#endif
  const lbopt::encode4::SignedTables& t = lbopt::encode4::kSignedTables;
  const hn::RebindToSigned<DF> di;
  const auto bits = hn::BitCast(di, y);
  const auto a = hn::Add(hn::And(bits, hn::Set(di, 0x7fffffff)), hn::ShiftRight<31>(bits));
  auto c = hn::IfThenElseZero(hn::Gt(a, hn::Set(di, t.first)), hn::Set(di, 4));
  c = encode4::AddIf(di, hn::Gt(a, encode4::Lookup8(di, t.second, c)), c, 2);
  c = encode4::AddIf(di, hn::Gt(a, encode4::Lookup8(di, t.third, c)), c, 1);
  c = encode4::AddIf(di, hn::Gt(bits, hn::Set(di, t.top)), c, 1);
  return hn::Add(encode4::SignOf(di, c, bits), hn::Set(di, 7));
}

// codebook_encode(kUnsigned4Mids, 16, y) per lane for 0 <= y <= 1, and a code <= 0 for -1 <= y < 0 (the packers
// clamp it to 0): a quotient by the block's scale never lies outside [-1, 1]. The count of midpoints (2 k + 3) / 32
// <= y is floor(16 y - 0.5) clamped to 0..15; 16 y is exact, and 16 y - 0.5 too wherever the floor can exceed 0.
// 16 y - 0.5 lies in [-0.5, 15.5] for y >= 0, where truncation gives the clamped floor: two instructions with no
// clamps.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> Encode4Linear(DF df, hn::Vec<DF> y) {
  return encode4::TruncInRange(df, hn::MulAdd(hn::Set(df, 16.0f), y, hn::Set(df, -0.5f)));
}

#undef LBOPT_ENCODE4_IN_X  // defined once per target
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define LBOPT_ENCODE4_IN_X 1
// Where a vector holds 16 floats (AVX-512) a 4-bit code needs no division at all: a block's scale s turns the 15
// midpoints into thresholds on x itself, T_k = the least float x with RN(x / s) >= mids[k] (RN is monotonic), so
// that the code of x / s is the count of T_k <= x. For both maps a candidate c whose code is c or c + 1 and one
// compare with T_c give the code (code_signed, code_linear). T_k is the least float above h_k * s, from the exact
// double product: per block a few double operations replace a division per element (docs/benchmarks.md, "CPU
// loop choices": thresholds in x).
struct Thresholds4 {
  hn::Vec<hn::ScalableTag<float>> table;  // T_k in lane k (unsigned map), in lane k + 1 and -inf in lane 0 (signed)
  float r;                                // RN(16 / s) for code_linear, RN(kBucketC / s) for code_signed

  // The table for block scale s, of the unsigned map (second) or the signed one.
  HWY_INLINE void init(bool second, float s) {
    const hn::ScalableTag<float> df;
    const hn::Repartition<double, decltype(df)> dd;
    const lbopt::encode4::MidsInX& t = second ? lbopt::encode4::kUnsigned4InX : lbopt::encode4::kSigned4InX;
    const auto vs = hn::Set(dd, double(s));
    // The exact product h_k * s rounded toward +inf by the conversion itself: the least float above it, in one
    // instruction where a round-to-nearest conversion, a compare and a step take six (per block and state)
    const auto half = [&](int k0) HWY_ATTR {
      const __m512d prod = hn::Mul(hn::Load(dd, t.h + k0), vs).raw;
      return hn::Vec<hn::Half<decltype(df)>>{_mm512_cvt_roundpd_ps(prod, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC)};
    };
    table = hn::Combine(df, half(8), half(0));
    r = second ? 16.0f / s : float(lbopt::encode4::kBucketC / double(s));
  }

  // codebook_encode(kSigned4Mids, 16, x / s) per lane, for finite |x| <= s. Bucket j of a = |x| r + 2^-8 (see
  // kSignedBuckets) gives c = 7 + n for x >= 0 and 6 - n for x < 0, n the positive midpoints below the bucket:
  // the code is c or c + 1 (the bucket's midpoint, if any, decides), and lane c + 1 of the table, T_c (-inf for
  // c = -1), settles which: one permute and one compare where the binary search took four compares, three
  // permutes and the copies of three masked adds (docs/benchmarks.md, "CPU loop choices": signed 4-bit encode).
  HWY_INLINE hn::Vec<hn::ScalableTag<int32_t>> code_signed(hn::Vec<hn::ScalableTag<float>> x) const {
    const hn::ScalableTag<float> df;
    const auto a = hn::MulAdd(hn::Abs(x), hn::Set(df, r), hn::Set(df, 0x1p-8f));
    const __m512i bucket = _mm512_srli_epi32(_mm512_castps_si512(a.raw), 21);  // the permute reads its low 5 bits
    const __m512i* first = reinterpret_cast<const __m512i*>(lbopt::encode4::kSignedBuckets.first);
    __m512i c1 = _mm512_permutex2var_epi32(_mm512_load_si512(first), bucket, _mm512_load_si512(first + 1));
    c1 = _mm512_mask_sub_epi32(c1, _mm512_movepi32_mask(_mm512_castps_si512(x.raw)), _mm512_set1_epi32(15), c1);
    const __m512 t = _mm512_permutexvar_ps(c1, table.raw);
    return {_mm512_mask_sub_epi32(c1, _mm512_cmp_ps_mask(x.raw, t, _CMP_LT_OQ), c1, _mm512_set1_epi32(1))};
  }

  // codebook_encode(kUnsigned4Mids, 16, x / s) per lane, for finite x. The unsigned map (k + 1) / 16 has the code
  // max(0, floor(w)) of y = RN(x / s), w = 16 y - 0.5 (Encode4Linear). z = RN(x * r - 0.5 - 2^-16) lies in
  // (w - 2^-15, w): r, y and z each err by at most 2^-20 for |x| <= s, under the 2^-16 taken off. So c' = max(0,
  // trunc(z)) is the code or one below it, and x >= T_c' (T_15 = +inf) settles which. For x >= 0, z > -1 and
  // trunc(z) >= 0 already; for x < 0 the code stays <= 0 (as Encode4Linear's), which the packers clamp to 0.
  HWY_INLINE hn::Vec<hn::ScalableTag<int32_t>> code_linear(hn::Vec<hn::ScalableTag<float>> x) const {
    const hn::ScalableTag<float> df;
    const hn::RebindToSigned<decltype(df)> di;
    const auto z = hn::MulAdd(x, hn::Set(df, r), hn::Set(df, -0.5f - 0x1p-16f));
    const auto c = encode4::TruncInRange(df, z);
    // the permute reads c's low 4 bits: a negative c (x < 0) reads a threshold above 0 > x and stays as it is
    const hn::Vec<decltype(df)> t{_mm512_permutexvar_ps(c.raw, table.raw)};
    return encode4::AddIf(di, hn::RebindMask(di, hn::Le(t, x)), c, 1);
  }
};
#else
#define LBOPT_ENCODE4_IN_X 0
#endif

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#endif  // LBOPT_KERNELS_CPU_CODEBOOK4_INL_H_
