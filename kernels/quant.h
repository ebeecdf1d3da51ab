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
  bool second = false;            // not a first moment: never negative, never rounded stochastically
  bool unsigned_map = false;      // the kind's non-negative map (4-bit: the linear one); else its signed map
  uint32_t zero = kNoZero;        // second: the code of 0, which a positive value must not take (guard_zero)
  static constexpr uint32_t kNoZero = ~0u;

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
    return guard_zero(K::encode_value(encode_input(x, b), mids), x);
  }

  // The code of x as a map's encode gave it, kept off zero for a positive x: a map with a code for 0 would flush
  // a tiny positive v to 0 and blow up m / sqrt(v); the smallest positive code, the next one up in every map,
  // keeps the update bounded.
  LBOPT_HD uint32_t guard_zero(uint32_t code, float x) const { return code == zero && x > 0.0f ? code + 1 : code; }

  LBOPT_HD float decode(uint32_t code, float scale) const { return K::decode_value(code, values) * scale; }

  // Stochastic rounding (LBOPT_FLAG_STATE_STOCHASTIC_ROUND), from x's nearest code `code` (encode's) in a block
  // of scale `scale`: of the two codes around x, lo and hi with decoded values v_lo <= x < v_hi, hi with
  // probability (x - v_lo) / (v_hi - v_lo) (taken as u (v_hi - v_lo) < x - v_lo, with u the top 24 bits of r over
  // 2^24), so that the decoded value is x on average. A state that moves by less than half a code step per step
  // keeps its nearest code forever; rounded so, it drifts as its float would. In x, not in x / scale: no
  // division, and the values are decode's. Every operation rounds once and none can be fused: the same code on
  // every backend. An exact value, or one past the end of the map, keeps its code. A kind that rounds in y
  // (K::stochastic_in_y, FP8) takes its own unbiased rule on y = x / scale instead, the nearest code unused.
  LBOPT_HD uint32_t round_stochastic(uint32_t code, float x, float scale, uint32_t r) const {
    if constexpr (K::stochastic_in_y) {
      static_assert(!K::reciprocal, "y = x / scale, as encode_input takes it");
      return K::encode_value_stochastic(x / scale, r);
    }
    const float v = decode(code, scale);
    if (x == v) return code;
    const bool up = x > v;
    const uint32_t next = K::next_code(code, up);
    if (next == code) return code;
    const float w = decode(next, scale);
    const float v_lo = up ? v : w, v_hi = up ? w : v;
    const float u = float(r >> 8) * 0x1p-24f;
    return u * (v_hi - v_lo) < x - v_lo ? (up ? next : code) : (up ? code : next);
  }
};

// The random bits of stochastic code rounding for the elements of one block of one state: a key per (seed, step,
// state, block) from random_bits, then per element (its index i in the block) a Weyl sequence, one xorshift and
// one multiply (the first round of murmur3's finalizer), which vectors compute lane by lane. round_stochastic
// reads the top 24 bits, which the multiply makes depend on every bit of its input. The same bits whatever the
// thread split or backend.
LBOPT_HD uint32_t state_round_key(uint64_t seed, int64_t step, int state, int64_t block) {
  return uint32_t(random_bits(seed ^ (uint64_t(state + 1) * 0x2545F4914F6CDD1Dull), uint64_t(step), uint64_t(block)));
}
LBOPT_HD uint32_t state_round_bits(uint32_t key, uint32_t i) {
  const uint32_t h = key + i * 0x9E3779B9u;
  return (h ^ (h >> 16)) * 0x85EBCA6Bu;
}

// How block `block` of state `state` rounds its codes: stochastically, with its state_round_key, where the step
// asks for it (state_sr, StepPlan::stochastic_states) and the state is a first moment; else to nearest.
struct StateRounding {
  bool stochastic;
  uint32_t key;
};
LBOPT_HD StateRounding state_rounding(bool state_sr, bool second, uint64_t seed, int64_t step, int state,
                                      int64_t block) {
  if (!state_sr || second) return {false, 0u};
  return {true, state_round_key(seed, step, state, block)};
}

// Where the codebooks live: host arrays for the CPU, shared memory for the GPU.
struct CodebookTables {
  const float *signed4_values, *signed4_mids, *unsigned4_values, *unsigned4_mids;
  const float *signed8_values, *signed8_mids, *unsigned8_values, *unsigned8_mids;
};

// The moment a state of kind K is kept as: kMomentSecondSigned is a 4-bit map, the unsigned map elsewhere.
template <class K>
LBOPT_HD constexpr Moment kind_moment(Moment m) {
  return m == kMomentSecondSigned && K::code_bits != 4 ? kMomentSecond : m;
}

// The codec of kind K for a moment: first moments on the signed maps, second ones on the non-negative maps (v and
// vmax), 4-bit kMomentSecondSigned on the signed map's non-negative codes (its code 7 is 0).
template <class K>
LBOPT_HD Codec<K> codec_of(Moment moment, const CodebookTables& t) {
  const Moment m = kind_moment<K>(moment);
  Codec<K> c;
  c.second = m != kMomentFirst;
  c.unsigned_map = m == kMomentSecond;
  if constexpr (K::entries == 16) {
    c.values = c.unsigned_map ? t.unsigned4_values : t.signed4_values;
    c.mids = c.unsigned_map ? t.unsigned4_mids : t.signed4_mids;
    if (m == kMomentSecondSigned) c.zero = 7;
  } else if constexpr (K::entries == 256) {
    c.values = c.unsigned_map ? t.unsigned8_values : t.signed8_values;
    c.mids = c.unsigned_map ? t.unsigned8_mids : t.signed8_mids;
  }
  if (K::zero_code && c.unsigned_map) c.zero = 0;
  return c;
}

template <class K>
Codec<K> host_codec(Moment moment) {
  using namespace codebook;
  static constexpr CodebookTables tables{kSigned4Values, kSigned4Mids, kUnsigned4Values, kUnsigned4Mids,
                                         kSigned8Values, kSigned8Mids, kUnsigned8Values, kUnsigned8Mids};
  return codec_of<K>(moment, tables);
}

// A state's codec named at run time (lbopt_quantize, lbopt_dequantize): the loops make Codec<K> of it.
struct StateCodec {
  int kind;
  Moment moment;
};

}  // namespace lbopt
