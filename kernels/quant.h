// Per-value and per-block quantization of optimizer states (docs/formats.md, "State kinds" and "Encoding and
// decoding"): how a float becomes a code under a block scale and back. The CPU and CUDA backends differ only in
// how they loop and reduce.
#pragma once
#include <math.h>
#include <stdint.h>

#include "codebooks.h"
#include "dtype_convert.h"
#include "hd.h"

namespace lbopt {

// Encoded kinds; values match lbopt_state_kind.
enum StateKind : int { kState4Bit = 0, kState8Bit = 1, kStateFp8 = 2, kStateFp32 = 3, kNumStateKinds = 4 };

// The kinds' names, for every binding and the registry's operator names (through lbopt_state_kind_name).
inline constexpr const char* kStateKindNames[kNumStateKinds] = {"4bit", "8bit", "fp8", "fp32"};
// The same in words, for operator docs.
inline constexpr const char* kStateKindDocs[kNumStateKinds] = {"4-bit", "8-bit", "float8 e4m3", "fp32"};

// Elements per scale block: the only place block sizes are written (torchao's: 128 for 4-bit, 256 for 8-bit and
// FP8). kMaxBlock bounds every kind's unit of work.
constexpr int64_t kBlock4Bit = 128;
constexpr int64_t kBlock8Bit = 256;
constexpr int64_t kBlockFp8 = 256;
constexpr int64_t kMaxBlock = 256;

// Elements per scale; 0 for the unblocked FP32 kind.
LBOPT_HD int64_t state_block_size(int kind) {
  return kind == kState4Bit ? kBlock4Bit : kind == kState8Bit ? kBlock8Bit : kind == kStateFp8 ? kBlockFp8 : 0;
}

// Elements per unit of work: the scale block, and a chunk of the same order for FP32.
LBOPT_HD int64_t work_block_size(int kind) { return kind == kStateFp32 ? kMaxBlock : state_block_size(kind); }

// Non-finite values never enter a quantized state: one NaN would poison its block's absmax forever.
LBOPT_HD float finite_or_zero(float x) { return isfinite(x) ? x : 0.0f; }

// Number of decision midpoints <= x: the nearest code, ties up (torchao). mids holds n entries, the last +inf,
// n a power of two, so the search is branch-free with log2(n) steps.
LBOPT_HD uint32_t codebook_encode(const float* mids, uint32_t n, float x) {
  uint32_t idx = 0;
  for (uint32_t step = n >> 1; step > 0; step >>= 1) idx += (mids[idx + step - 1] <= x) ? step : 0u;
  return idx;
}

// float8 e4m3fn with round-to-nearest-even and saturation to +-448 (a plain cast can make NaN past 448).
LBOPT_HD uint8_t fp8_e4m3_encode(float x) {
  const uint8_t sign = uint8_t((float_bits(x) >> 24) & 0x80u);
  float a = fabsf(x);
  if (!(a < 448.0f)) a = 448.0f;          // saturate (NaN too; callers pass finite values)
  if (a < 0.015625f) {                     // below 2^-6: subnormal steps of 2^-9; 8 * 2^-9 is the code 0x08
    return uint8_t(sign | uint8_t(rintf(a * 512.0f)));
  }
  uint32_t b = float_bits(a);
  b += 0x7ffffu + ((b >> 20) & 1u);        // round the 23-bit mantissa to 3 bits, nearest even
  const uint32_t code = (b >> 20) - (120u << 3);  // (exponent - 120) << 3 | the 3 mantissa bits, in one step
  return uint8_t(sign | (code > 0x7eu ? 0x7eu : code));
}

LBOPT_HD float fp8_e4m3_decode(uint8_t c) {
  const uint32_t exp = (c >> 3) & 0xfu;
  const uint32_t mant = c & 7u;
  const float mag = exp == 0 ? float(mant) * 0.001953125f : bits_float(((exp + 120u) << 23) | (mant << 20));
  return (c & 0x80u) ? -mag : mag;
}

// 4-bit codes: element 2i in the high nibble, 2i+1 in the low one (torchao's packing).
LBOPT_HD uint32_t nibble_get(const uint8_t* codes, int64_t i) {
  return (codes[i >> 1] >> ((i & 1) ? 0 : 4)) & 0xfu;
}

// The byte offset of element e (a block's first, so even for 4-bit) in a state of that kind.
LBOPT_HD int64_t state_byte(int kind, int64_t e) {
  return kind == kState4Bit ? e >> 1 : kind == kStateFp32 ? e * 4 : e;
}

// How one state (a kind and a moment) maps floats to codes. Table pointers are supplied by the backend (host
// arrays on the CPU, constant memory on the GPU).
struct StateCodec {
  int kind;
  const float* values;  // codebook (unused for FP8 / FP32)
  const float* mids;
  uint32_t entries;     // 16 or 256
  bool guard_zero;      // second moment on a map whose code 0 is 0: a positive value must not decode to 0

  // A block's scale as the encode takes it: scale is what the block stores; 8-bit encodes x * RN(1 / scale)
  // (as bitsandbytes' blockwise quantizer does), the reciprocal computed here once per block, and 4-bit and FP8
  // x / scale (torchao's rounding). The division cost the 8-bit step a divider-bound share of its time on
  // AVX-512; the two differ by at most an ulp, which moves a code only for a y within an ulp of a midpoint (for
  // scales below 2^126: above, the reciprocal is subnormal and keeps fewer bits, a few ulps). 4-bit (whose AVX-512
  // encode has no division: thresholds in x, codebook4-inl.h) and FP8 gain too little from the product to leave
  // torchao's rounding (docs/benchmarks.md, "CPU loop choices": 8-bit encode by a reciprocal).
  struct BlockScale {
    float scale;
    float inverse;  // 8-bit only
  };

  // The scale of a block whose finite absmax is absmax.
  LBOPT_HD BlockScale block_scale(float absmax) const {
    const float s = absmax > 1e-12f ? absmax : 1e-12f;
    if (kind == kStateFp8) return {s / 448.0f, 0.0f};
    return {s, kind == kState8Bit ? 1.0f / s : 0.0f};
  }

  // The value encode maps to a code.
  LBOPT_HD float encode_input(float x, BlockScale b) const {
    return kind == kState8Bit ? x * b.inverse : x / b.scale;
  }

  LBOPT_HD uint32_t encode(float x, BlockScale b) const {
    const float y = encode_input(x, b);
    // the two sizes spelled out, so that each search unrolls (and a codec known at compile time keeps one)
    uint32_t code = kind == kStateFp8 ? fp8_e4m3_encode(y)
                    : entries == 16  ? codebook_encode(mids, 16, y)
                                     : codebook_encode(mids, 256, y);
    // Maps whose code 0 is the value 0 (8-bit unsigned, e4m3) would flush a tiny positive v to 0 and blow up
    // m / sqrt(v); the smallest positive code is one code step away and keeps the update bounded.
    if (guard_zero && code == 0 && y > 0.0f) code = 1;
    return code;
  }

  LBOPT_HD float decode(uint32_t code, float scale) const {
    return (kind == kStateFp8 ? fp8_e4m3_decode(uint8_t(code)) : values[code]) * scale;
  }
};

// Where the codebooks live: host arrays for the CPU, constant memory for the GPU.
struct CodebookTables {
  const float *signed4_values, *signed4_mids, *unsigned4_values, *unsigned4_mids;
  const float *signed8_values, *signed8_mids, *unsigned8_values, *unsigned8_mids;
};

// The codec of (kind, second_moment): m on the signed maps, v and vmax on the non-negative ones.
LBOPT_HD StateCodec codec_for(int kind, bool second_moment, const CodebookTables& t) {
  switch (kind) {
    case kState4Bit:
      return second_moment ? StateCodec{kind, t.unsigned4_values, t.unsigned4_mids, 16, false}
                           : StateCodec{kind, t.signed4_values, t.signed4_mids, 16, false};
    case kState8Bit:
      return second_moment ? StateCodec{kind, t.unsigned8_values, t.unsigned8_mids, 256, true}
                           : StateCodec{kind, t.signed8_values, t.signed8_mids, 256, false};
    default:
      return StateCodec{kind, nullptr, nullptr, 0, second_moment};
  }
}

inline StateCodec host_codec(int kind, bool second_moment) {
  using namespace codebook;
  static constexpr CodebookTables tables{kSigned4Values, kSigned4Mids, kUnsigned4Values, kUnsigned4Mids,
                                         kSigned8Values, kSigned8Mids, kUnsigned8Values, kUnsigned8Mids};
  return codec_for(kind, second_moment, tables);
}

}  // namespace lbopt
