// Per-block quantization of optimizer states (docs/formats.md, "State kinds" and "Encoding and decoding"): how a
// float becomes a code under a block scale and back, for a kind of state_kinds.h. The CPU and CUDA backends differ
// only in how they loop and reduce.
#pragma once
#include <math.h>
#include <stdint.h>

#include "codebooks.h"
#include "hd.h"
#include "state_kinds.h"

namespace lbopt {

// Non-finite values never enter a quantized state: one NaN would poison its block's absmax forever.
LBOPT_HD float finite_or_zero(float x) { return isfinite(x) ? x : 0.0f; }

// How one state (a kind K and a moment) maps floats to codes. Table pointers are supplied by the backend (host
// arrays on the CPU, shared memory on the GPU).
template <class K>
struct Codec {
  const float* values = nullptr;  // the moment's codebook (kinds with one)
  const float* mids = nullptr;
  bool second = false;            // a second moment: the non-negative map, zero guarded where K has a zero code

  // A block's scale as the encode takes it: scale is what the block stores, inverse RN(1 / scale) where
  // K::reciprocal. The two encodes differ by at most an ulp, which moves a code only for a y within an ulp of a
  // midpoint (for scales below 2^126: above, the reciprocal is subnormal and keeps fewer bits).
  struct BlockScale {
    float scale;
    float inverse;
  };

  // The scale of a block whose finite absmax is absmax.
  LBOPT_HD BlockScale block_scale(float absmax) const {
    const float s = absmax > 1e-12f ? absmax : 1e-12f;
    return {s / K::range, K::reciprocal ? 1.0f / s : 0.0f};
  }

  // The value encode maps to a code.
  LBOPT_HD float encode_input(float x, BlockScale b) const { return K::reciprocal ? x * b.inverse : x / b.scale; }

  LBOPT_HD uint32_t encode(float x, BlockScale b) const {
    const float y = encode_input(x, b);
    return guard_zero(K::encode_value(y, mids), y);
  }

  // The code of y = encode_input(...) as a map's encode gave it, kept off zero for a positive y: a map whose code
  // 0 is the value 0 would flush a tiny positive v to 0 and blow up m / sqrt(v); the smallest positive code is
  // one code step away and keeps the update bounded.
  LBOPT_HD uint32_t guard_zero(uint32_t code, float y) const {
    return K::zero_code && second && code == 0 && y > 0.0f ? 1u : code;
  }

  LBOPT_HD float decode(uint32_t code, float scale) const { return K::decode_value(code, values) * scale; }
};

// Where the codebooks live: host arrays for the CPU, shared memory for the GPU.
struct CodebookTables {
  const float *signed4_values, *signed4_mids, *unsigned4_values, *unsigned4_mids;
  const float *signed8_values, *signed8_mids, *unsigned8_values, *unsigned8_mids;
};

// The codec of kind K for a first (signed maps) or second moment (the non-negative ones: v and vmax).
template <class K>
LBOPT_HD Codec<K> codec_of(bool second, const CodebookTables& t) {
  if constexpr (K::entries == 16)
    return {second ? t.unsigned4_values : t.signed4_values, second ? t.unsigned4_mids : t.signed4_mids, second};
  else if constexpr (K::entries == 256)
    return {second ? t.unsigned8_values : t.signed8_values, second ? t.unsigned8_mids : t.signed8_mids, second};
  else
    return {nullptr, nullptr, second};
}

template <class K>
Codec<K> host_codec(bool second) {
  using namespace codebook;
  static constexpr CodebookTables tables{kSigned4Values, kSigned4Mids, kUnsigned4Values, kUnsigned4Mids,
                                         kSigned8Values, kSigned8Mids, kUnsigned8Values, kUnsigned8Mids};
  return codec_of<K>(second, tables);
}

// A state's codec named at run time (lbopt_quantize, lbopt_dequantize): the loops make Codec<K> of it.
struct StateCodec {
  int kind;
  bool second_moment;
};

}  // namespace lbopt
