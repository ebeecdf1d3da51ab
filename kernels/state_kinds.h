// The state kinds: how a state's values are stored (docs/formats.md, "State kinds"). One struct per kind holds what
// the loops, the layout, the bindings and the registry read of it: its block, its codes and its per-value map.
// Kinds below is the only list of them; the per-block codec that uses a kind's map is quant.h's Codec.
#ifndef LBOPT_STATE_KINDS_H
#define LBOPT_STATE_KINDS_H
#include <math.h>
#include <stdint.h>

#include "dtype_convert.h"
#include "hd.h"
#include "type_list.h"

namespace lbopt {

// Encoded kinds; values match lbopt_state_kind.
enum StateKind : int { kState4Bit = 0, kState8Bit = 1, kStateFp8 = 2, kStateFp32 = 3, kNumStateKinds = 4 };

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

// fp8_e4m3_encode rounded stochastically, unbiased, for finite y: the magnitude takes the code below it or the one
// above, above when R + f >= 2^20, with R the top 20 bits of the random bits r and f the 20 bits that the code
// drops of the magnitude's place between the two (so with probability f / 2^20, the fraction of the step it lies
// above the code below). In the normal range f is the float's low 20 mantissa bits and the carry of the integer
// add is the rounding; below 2^-6, a * 512 + 8 puts a's place in steps of 2^-9 on the same 20 bits (rounded to
// nearest there, 2^-21 of a step). Exact values (f = 0) keep their code; 448 and past it stay 0x7e.
LBOPT_HD uint8_t fp8_e4m3_encode_stochastic(float y, uint32_t r) {
  const uint8_t sign = uint8_t((float_bits(y) >> 24) & 0x80u);
  float a = fabsf(y);
  if (!(a < 448.0f)) a = 448.0f;
  const uint32_t random = r >> 12;
  if (a < 0.015625f) return uint8_t(sign | ((float_bits(a * 512.0f + 8.0f) - 0x41000000u + random) >> 20));
  return uint8_t(sign | (((float_bits(a) + random) >> 20) - (120u << 3)));
}

LBOPT_HD float fp8_e4m3_decode(uint8_t c) {
  const uint32_t exp = (c >> 3) & 0xfu;
  const uint32_t mant = c & 7u;
  const float mag = exp == 0 ? float(mant) * 0.001953125f : bits_float(((exp + 120u) << 23) | (mant << 20));
  return (c & 0x80u) ? -mag : mag;
}

// Which codebook a state's codes index; values match lbopt_moment. A first moment is signed; the others are
// never negative, never round stochastically, and keep a positive value off a code for 0. kMomentSecondSigned
// is a 4-bit state on the signed map's non-negative codes (finer near 0 than the unsigned linear map); on the
// other kinds it is the same as kMomentSecond.
enum Moment : int { kMomentFirst = 0, kMomentSecond = 1, kMomentSecondSigned = 2, kNumMoments = 3 };

// What a kind is unless it says otherwise.
struct KindDefaults {
  static constexpr bool float_codes = false;  // the "codes" are the float32 values themselves, with no scales
  static constexpr uint32_t entries = 0;      // the size of its codebooks (a signed and an unsigned map); 0: none
  static constexpr float range = 1.0f;        // the value a block's absmax encodes to: scale = absmax / range
  static constexpr bool reciprocal = false;   // the encode takes x * RN(1 / scale) rather than x / scale
  static constexpr bool zero_code = false;    // a second moment's map has a code for 0 (which a v > 0 must not take)
  // The first-moment codes round stochastically by default where the optimizer asks for it (kStochasticStates)
  static constexpr bool stochastic_codes = false;
  // The kind rounds stochastically in y itself (encode_value_stochastic), not between the nearest code's
  // neighbours' values in x (Codec::round_stochastic)
  static constexpr bool stochastic_in_y = false;
};

// A kind whose codes index codebooks of kEntries values (the nearest value, by codebook_encode's search).
template <uint32_t kEntries>
struct CodebookKind : KindDefaults {
  static constexpr uint32_t entries = kEntries;
  LBOPT_HD static uint32_t encode_value(float y, const float* mids) { return codebook_encode(mids, kEntries, y); }
  LBOPT_HD static float decode_value(uint32_t code, const float* values) { return values[code]; }
  // The next code in value order, up or down; code itself at the map's end.
  LBOPT_HD static uint32_t next_code(uint32_t code, bool up) {
    return up ? (code + 1 < kEntries ? code + 1 : code) : (code > 0 ? code - 1 : code);
  }
};

struct Kind4Bit : CodebookKind<16> {
  static constexpr StateKind id = kState4Bit;
  static constexpr const char* name = "4bit";
  static constexpr const char* doc = "4-bit";
  static constexpr int64_t block = 128;       // elements per scale (torchao's)
  static constexpr int64_t work_block = block;
  static constexpr int code_bits = 4;         // element 2i in the high nibble, 2i + 1 in the low one (torchao's)
  static constexpr bool stochastic_codes = true;
};

struct Kind8Bit : CodebookKind<256> {
  static constexpr StateKind id = kState8Bit;
  static constexpr const char* name = "8bit";
  static constexpr const char* doc = "8-bit";
  static constexpr int64_t block = 256;       // torchao's
  static constexpr int64_t work_block = block;
  static constexpr int code_bits = 8;
  // bitsandbytes' blockwise quantizer multiplies by the reciprocal; a division costs the 8-bit step a divider-bound
  // share of its time (docs/formats.md, "Encoding and decoding")
  static constexpr bool reciprocal = true;
  static constexpr bool zero_code = true;     // the unsigned dynamic map's code 0 is 0
  // stochastic_codes: no. Its steps are fine enough that SGD, Lion and AdEMAMix train as with fp32 states rounded
  // to nearest, and the neighbouring values cost two gathers per vector (docs/optimizers.md)
};

struct KindFp8 : KindDefaults {
  static constexpr StateKind id = kStateFp8;
  static constexpr const char* name = "fp8";
  static constexpr const char* doc = "float8 e4m3";
  static constexpr int64_t block = 256;
  static constexpr int64_t work_block = block;
  static constexpr int code_bits = 8;
  static constexpr float range = 448.0f;      // e4m3's largest finite value
  static constexpr bool zero_code = true;
  static constexpr bool stochastic_codes = true;
  static constexpr bool stochastic_in_y = true;
  LBOPT_HD static uint32_t encode_value(float y, const float*) { return fp8_e4m3_encode(y); }
  LBOPT_HD static uint32_t encode_value_stochastic(float y, uint32_t r) { return fp8_e4m3_encode_stochastic(y, r); }
  LBOPT_HD static float decode_value(uint32_t code, const float*) { return fp8_e4m3_decode(uint8_t(code)); }
  // The next code in value order, up or down (sign and magnitude: up is away from 0 for a positive code); code
  // itself at +-448. Never asked to cross 0: a code's sign is its value's.
  LBOPT_HD static uint32_t next_code(uint32_t code, bool up) {
    const uint32_t mag = code & 0x7fu;
    const bool away = up == ((code & 0x80u) == 0);
    return (code & 0x80u) | (away ? (mag < 0x7eu ? mag + 1 : mag) : (mag > 0 ? mag - 1 : mag));
  }
};

struct KindFp32 : KindDefaults {
  static constexpr StateKind id = kStateFp32;
  static constexpr const char* name = "fp32";
  static constexpr const char* doc = "fp32";
  static constexpr int64_t block = 0;         // no scales
  static constexpr int64_t work_block = 256;  // a unit of work of the same order as the others'
  static constexpr int code_bits = 32;
  static constexpr bool float_codes = true;
};

// In lbopt_state_kind order (StateKind): a kind's index is its id.
using Kinds = TypeList<Kind4Bit, Kind8Bit, KindFp8, KindFp32>;
static_assert(Kinds::size == kNumStateKinds, "one list entry per StateKind");

// What the layout and the loops assume of every kind: codes of 4 bits (two a byte) or of whole bytes, float32
// values exactly where there are no scales.
template <class... Ks>
constexpr bool kinds_are_laid_out(TypeList<Ks...>) {
  return (((Ks::code_bits == 4 || Ks::code_bits % 8 == 0) && Ks::float_codes == (Ks::block == 0)) && ...);
}
static_assert(kinds_are_laid_out(Kinds{}), "a kind the layout cannot hold");

// f(Kind{}) for the kind of that id (validation accepts no other).
template <class F>
LBOPT_HD decltype(auto) with_kind(int kind, F&& f) {
  return with_entry<Kinds>(kind, static_cast<F&&>(f));
}

template <class... Ks>
constexpr int64_t max_work_block(TypeList<Ks...>) {
  int64_t m = 0;
  ((m = Ks::work_block > m ? Ks::work_block : m), ...);
  return m;
}
// Every kind's unit of work fits in kMaxBlock elements.
constexpr int64_t kMaxBlock = max_work_block(Kinds{});

// Elements per scale; 0 for the unblocked FP32 kind.
LBOPT_HD int64_t state_block_size(int kind) {
  return with_kind(kind, [](auto k) { return decltype(k)::block; });
}

// Elements per unit of work: the scale block, and a chunk of the same order for FP32.
LBOPT_HD int64_t work_block_size(int kind) {
  return with_kind(kind, [](auto k) { return decltype(k)::work_block; });
}

// The byte offset of element e (a block's first, so even for 4-bit) in a state of kind K.
template <class K>
LBOPT_HD int64_t state_byte(int64_t e) {
  return e * K::code_bits / 8;
}

// Kind K's code of element i of a state whose codes start at codes (not FP32's).
template <class K>
LBOPT_HD uint32_t code_at(const uint8_t* codes, int64_t i) {
  if constexpr (K::code_bits == 4) return (codes[i >> 1] >> ((i & 1) ? 0 : 4)) & 0xfu;
  else return codes[i];
}

// The name of a kind (lbopt_state_kind_name, the registry's operator names) and the same in words (operator docs).
inline const char* state_kind_name(int kind) {
  return with_kind(kind, [](auto k) { return decltype(k)::name; });
}
inline const char* state_kind_doc(int kind) {
  return with_kind(kind, [](auto k) { return decltype(k)::doc; });
}

}  // namespace lbopt
#endif  // LBOPT_STATE_KINDS_H
