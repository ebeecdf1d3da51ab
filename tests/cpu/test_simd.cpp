// The SIMD kernels give bit-identical params, codes and scales to the portable kernels, on every instruction set
// this machine supports (each forced in turn through Highway's test hook), for every kind, dtype and flag; and
// both encode the quotient docs/formats.md gives for each kind ("Encoding and decoding").
#include <doctest/doctest.h>

#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>
#include <string>

#include "harness.h"
#include "simd_targets.h"

using namespace test;

namespace {

ref::Dtype ref_dtype(DLDataType t) { return t.bits == 32 ? ref::kF32 : (t.code == kDLBfloat ? ref::kBF16 : ref::kF16); }

struct Run {
  Buffer p, g;
  State m, v, vmax;
  Run(lbopt_state_kind k, DLDataType pt, DLDataType gt, int64_t n, bool nonfinite)
      : p(pt, {n}), g(gt, {n}), m(k, n), v(k, n), vmax(k, n) {
    std::mt19937_64 rng(uint64_t(n) * 7 + k);
    std::normal_distribution<double> nd;
    const ref::Dtype pd = ref_dtype(pt), gd = ref_dtype(gt);
    for (int64_t i = 0; i < n; ++i) {
      store(pd, p.t.data, i, ref::to_dtype(pd, 0.1 * nd(rng)));
      // tiny grads (subnormal halves, near-zero codes) and, in some runs, NaN / Inf in a few blocks
      double gi = (i % 97 == 0 ? 1e-30 : (i % 89 == 0 ? 1e-6 : 0.01)) * nd(rng);
      if (nonfinite && i % 301 == 5) gi = i % 2 ? NAN : -INFINITY;
      store(gd, g.t.data, i, ref::to_dtype(gd, gi));
    }
    for (State* s : {&m, &v, &vmax}) lbopt_state_init(k, n, s->view(), nullptr);
    if (n % 2 == 0) return;  // odd sizes also run on buffers one element off their 64-byte alignment
    for (Buffer* b : {&p, &g, m.codes.get(), v.codes.get(), vmax.codes.get()}) shift_one_element(*b);
  }
  static void shift_one_element(Buffer& b) {
    const size_t elem = b.t.dtype.bits / 8;
    memmove(static_cast<uint8_t*>(b.t.data) + elem, b.t.data, size_t(b.t.shape[0]) * elem);
    b.t.byte_offset = elem;
  }
  uint64_t digest() const {
    uint64_t d = hash(p) ^ 3 * hash(*m.codes) ^ 5 * hash(*v.codes) ^ 7 * hash(*vmax.codes);
    if (m.scales) d ^= 11 * hash(*m.scales) ^ 13 * hash(*v.scales) ^ 17 * hash(*vmax.scales);
    return d;
  }
};

// Quantized states as a caller may hand them over, not as lbopt wrote them: random code bytes under scales that
// are negative, zero, subnormal, huge or not finite (a negative scale makes v < 0, whose 4-bit codes SIMD gets
// from a code <= 0 and a saturating pack).
void scramble(State& st, uint64_t seed) {
  static const float kScales[] = {-1.0f, -3e-5f, 0.0f, -0.0f, 1e-40f, 3e38f, 1.0f, 0.5f, -2e10f, INFINITY, NAN};
  std::mt19937_64 rng(seed);
  const DLTensor& codes = st.codes->t;
  uint8_t* const bytes = static_cast<uint8_t*>(codes.data) + codes.byte_offset;
  for (int64_t i = 0; i < codes.shape[0] * (codes.dtype.bits / 8); ++i) bytes[i] = uint8_t(rng());
  float* const scales = reinterpret_cast<float*>(static_cast<uint8_t*>(st.scales->t.data) + st.scales->t.byte_offset);
  for (int64_t b = 0; b < st.scales->t.shape[0]; ++b) scales[b] = kScales[rng() % (sizeof kScales / sizeof kScales[0])];
}

uint64_t steps(lbopt_state_kind k, DLDataType pt, DLDataType gt, int64_t n, uint32_t flags, bool nonfinite,
               bool scrambled = false) {
  Run r(k, pt, gt, n, nonfinite);
  if (scrambled)
    for (State* st : {&r.m, &r.v, &r.vmax}) scramble(*st, uint64_t(n) * 131 + uint64_t(k));
  lbopt_adamw_config cfg;
  lbopt_adamw_config_init(&cfg, sizeof cfg);
  cfg.state_kind = k;
  cfg.flags = flags;
  cfg.seed = 0x5eed0000u + uint64_t(n);
  cfg.beta1 = flags & LBOPT_FLAG_MAXIMIZE ? 0.3 : 0.9;  // both branches of the lerp
  for (int64_t s = 1; s <= 3; ++s) {
    const bool ams = flags & LBOPT_FLAG_AMSGRAD;
    const lbopt_adamw_slot slot{sizeof slot, &r.p.t, &r.g.t, r.m.view(), r.v.view(), ams ? r.vmax.view() : lbopt_state{},
                                s};
    REQUIRE(lbopt_adamw_step(&cfg, 1e-3 * double(s), &slot, 1, nullptr) == LBOPT_OK);
  }
  return r.digest();
}

uint64_t all_cases() {
  uint64_t d = 0;
  const DLDataType dts[] = {f32(), bf16(), f16()};
  const uint32_t flag_sets[] = {0u, LBOPT_FLAG_ADAM_COUPLED_DECAY | LBOPT_FLAG_AMSGRAD,
                                LBOPT_FLAG_MAXIMIZE | LBOPT_FLAG_AMSGRAD | LBOPT_FLAG_BF16_STOCHASTIC_ROUND |
                                    LBOPT_FLAG_STATE_STOCHASTIC_ROUND};
  for (int k = 0; k < 4; ++k)
    for (const DLDataType& pt : dts)
      for (const DLDataType& gt : dts)
        for (uint32_t flags : flag_sets)
          for (int64_t n : {int64_t(256), int64_t(1000), int64_t(4096 + 77), int64_t(2048 + 1)})
            for (bool nonfinite : {false, true})
              d = d * 31 + steps(lbopt_state_kind(k), pt, gt, n, flags, nonfinite);
  return d;
}

uint64_t scrambled_cases() {
  uint64_t d = 0;
  const uint32_t flag_sets[] = {0u, LBOPT_FLAG_AMSGRAD};
  for (int k = 0; k < 3; ++k)
    for (uint32_t flags : flag_sets)
      for (int64_t n : {int64_t(1024), int64_t(4096 + 77)})
        d = d * 31 + steps(lbopt_state_kind(k), f32(), f32(), n, flags, false, true);
  return d;
}

// bf16 and f16 params at the edges of their rounding, three steps: subnormal values (which AVX512_BF16's
// conversion flushes to zero, so the AVX-512 kernels must not use it on a vector that holds one), the least normals,
// +-0, +-Inf, NaN and the largest finite values, under an lr small enough that subnormal params stay subnormal with
// low bits to round. Vectors (of up to 16 lanes) with every lane subnormal, with one, and with none. Grads of the
// params' dtype (the loops compiled for it) and float32 ones (the general loops). Digest of the params.
uint64_t param_edge_cases() {
  uint64_t d = 0;
  for (const DLDataType& pt : {bf16(), f16()})
  for (const DLDataType& gt : {pt, f32()}) {
    const bool is_bf16 = pt.code == kDLBfloat;
    const double least_normal = is_bf16 ? 0x1p-126 : 0x1p-14;
    const uint16_t inf = is_bf16 ? 0x7f80 : 0x7c00, max = is_bf16 ? 0x7f7f : 0x7bff;
    const uint16_t payload = is_bf16 ? 0x7f : 0x3ff;  // a NaN's mantissa bits: a payload the rounding must drop
    const int64_t n = 4096;
    Buffer p(pt, {n}), g(gt, {n});
    State m(LBOPT_STATE_FP32, n), v(LBOPT_STATE_FP32, n);
    std::mt19937_64 rng(11);
    std::normal_distribution<double> nd;
    uint16_t* const bits = static_cast<uint16_t*>(p.t.data);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t group = i / 16 % 4, lane = i % 16;
      const bool negative = rng() % 2;
      const double sign = negative ? -1.0 : 1.0;
      if (group == 0 || (group == 1 && lane == 5)) {  // subnormal: a multiple of least_normal / 128
        store(ref_dtype(pt), bits, i, sign * least_normal * double(1 + rng() % 127) / 128.0);
      } else {
        store(ref_dtype(pt), bits, i, sign * least_normal * (1.0 + double(rng() % 64) / 64.0));
        if (group == 2 && lane < 4) {
          const uint16_t nan = uint16_t(inf | (uint16_t(rng()) & payload) | 1);  // never the payload 0 (Inf)
          const uint16_t special[4] = {nan, inf, 0, max};
          bits[i] = uint16_t(special[lane] | (negative ? 0x8000 : 0));
        }
      }
      store(ref_dtype(gt), g.t.data, i, ref::to_dtype(ref_dtype(gt), 1e-3 * nd(rng)));
    }
    for (State* st : {&m, &v}) lbopt_state_init(LBOPT_STATE_FP32, n, st->view(), nullptr);
    lbopt_adamw_config cfg;
    lbopt_adamw_config_init(&cfg, sizeof cfg);
    cfg.state_kind = LBOPT_STATE_FP32;
    for (int64_t s = 1; s <= 3; ++s) {
      const lbopt_adamw_slot slot{sizeof slot, &p.t, &g.t, m.view(), v.view(), lbopt_state{}, s};
      REQUIRE(lbopt_adamw_step(&cfg, is_bf16 ? 1e-40 : 1e-8, &slot, 1, nullptr) == LBOPT_OK);
    }
    d = d * 31 + hash(p);
  }
  return d;
}

// The midpoints between neighbouring values of a map (k < 3), from the library's own decode at scale 1.
// Every code's value at scale 1, by code.
std::vector<float> code_values(lbopt_state_kind kind, lbopt_moment mo) {
  const int64_t bs = kind == LBOPT_STATE_4BIT ? 128 : 256, codes = kind == LBOPT_STATE_4BIT ? 16 : 256;
  Buffer all(f32(), {bs});
  State table(kind, bs);
  for (int64_t c = 0; c < codes; ++c) set_code(kind, *table.codes, c, int(c));
  table.scales->as<float>()[0] = 1.0f;
  REQUIRE(lbopt_dequantize(kind, mo, table.view(), &all.t, nullptr) == LBOPT_OK);
  return std::vector<float>(all.as<float>(), all.as<float>() + codes);
}

std::vector<float> map_mids(lbopt_state_kind kind, lbopt_moment mo) {
  std::vector<float> vals = code_values(kind, mo);
  std::sort(vals.begin(), vals.end());
  std::vector<float> mids;
  for (size_t i = 0; i + 1 < vals.size(); ++i) mids.push_back(0.5f * (vals[i] + vals[i + 1]));
  return mids;
}

// Quantize inputs at and around every decision point (codebook midpoints, e4m3 rounding ties, the saturation
// edge) and dequantize every code byte with varied scales; digest of codes, scales and floats.
uint64_t quantize_cases() {
  uint64_t d = 0;
  for (int k = 0; k < 3; ++k)
    for (lbopt_moment mo : {LBOPT_MOMENT_FIRST, LBOPT_MOMENT_SECOND, LBOPT_MOMENT_SECOND_SIGNED}) {
      const lbopt_state_kind kind = lbopt_state_kind(k);
      const int64_t bs = k == 0 ? 128 : 256;
      std::vector<float> xs;
      for (float mid : map_mids(kind, mo))
        for (float x = nextafterf(nextafterf(mid, -1e9f), -1e9f), j = 0; j < 5; ++j, x = nextafterf(x, 1e9f))
          xs.push_back(x);
      for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 460.0f, 470.0f}) xs.push_back(x);  // (quantize refuses NaN, Inf)
      const float anchor = k == 2 ? 448.0f : 1.0f;  // the block scale 1: y = x
      std::vector<float> in;
      for (size_t i = 0; i < xs.size(); ++i) {
        const bool second = mo != LBOPT_MOMENT_FIRST;  // a second moment is >= 0
        if (int64_t(in.size()) % bs == 0) in.push_back(i % 2 && !second ? -anchor : anchor);
        if (std::fabs(xs[i]) <= anchor && !(second && std::signbit(xs[i]))) in.push_back(xs[i]);
      }
      while (int64_t(in.size()) % bs) in.push_back(0.25f);
      const int64_t n = int64_t(in.size());
      Buffer src(f32(), {n}), back(f32(), {n});
      memcpy(src.t.data, in.data(), in.size() * sizeof(float));
      State st(kind, n);
      const lbopt_status qs = lbopt_quantize(kind, mo, &src.t, st.view(), nullptr);
      INFO(std::string(lbopt_last_error()));
      REQUIRE(qs == LBOPT_OK);
      d = d * 31 + (hash(*st.codes) ^ 3 * hash(*st.scales));
      // every code byte under scales of varied magnitude (subnormal products included)
      for (int64_t i = 0; i < int64_t(st.codes->t.shape[0]); ++i) static_cast<uint8_t*>(st.codes->t.data)[i] = uint8_t(i * 7);
      for (int64_t b = 0; b < st.scales->t.shape[0]; ++b) static_cast<float*>(st.scales->t.data)[b] = ldexpf(1.3f, int(b % 9) * 17 - 140);
      REQUIRE(lbopt_dequantize(kind, mo, st.view(), &back.t, nullptr) == LBOPT_OK);
      d = d * 31 + hash(back);
    }
  return d;
}

// 4-bit and 8-bit quantize with block scales of every magnitude, inputs at and around x = mid * scale for every
// midpoint (where an encode without the division, on thresholds in x, must still agree with RN(x / scale), and
// 8-bit's x * RN(1 / scale) moves codes) and every edge of the signed 4-bit map's candidate buckets; digest of the
// codes.
uint64_t scaled_quantize_cases() {
  std::mt19937_64 rng(4);
  std::vector<float> scales = {1e-13f, 1e-12f, 1.7e-10f, 3e-5f, 0.37f, 1.0f, 1.5f, 1000.1f, 3e20f, 1e38f, 3.4028235e38f};
  for (int e = -40; e <= 127; e += 7) scales.push_back(ldexpf(1.0f, e));
  std::uniform_real_distribution<double> log_scale(-27.6, 88.0);
  for (int i = 0; i < 300; ++i) scales.push_back(float(std::exp(log_scale(rng))));
  uint64_t d = 0;
  for (lbopt_state_kind kind : {LBOPT_STATE_4BIT, LBOPT_STATE_8BIT})
  for (lbopt_moment mo : {LBOPT_MOMENT_FIRST, LBOPT_MOMENT_SECOND}) {
    const int64_t block = kind == LBOPT_STATE_4BIT ? 128 : 256;
    std::vector<float> probes = map_mids(kind, mo);
    // The signed map's AVX-512 encode takes a candidate from the bucket of |y| (1 - 2^-8 - 2^-20) + 2^-8 (the
    // float's exponent and 2 mantissa bits): its bucket edges too.
    if (kind == LBOPT_STATE_4BIT && mo == LBOPT_MOMENT_FIRST)
      for (int e = -8; e < 0; ++e)
        for (int q = 0; q <= 4; ++q) {
          const double y = (std::ldexp(1.0 + q / 4.0, e) - 0x1p-8) / (1.0 - 0x1p-8 - 0x1p-20);
          probes.push_back(float(y));
          probes.push_back(float(-y));
        }
    std::vector<float> in;
    for (float anchor : scales) {
      std::vector<float> xs;
      const float s = std::max(anchor, 1e-12f);  // the scale lbopt uses for this block
      for (float probe : probes) {  // (a midpoint here may be an ulp off the library's: 4 ulps either side)
        float x = probe * s;
        for (int u = 0; u < 4; ++u) x = nextafterf(x, -INFINITY);
        for (int u = 0; u < 9; ++u, x = nextafterf(x, INFINITY)) xs.push_back(x);
      }
      // blocks: the anchor sets absmax (and so the scale), the rest lie within it
      size_t next = 0;
      while (next < xs.size()) {
        in.push_back(anchor);
        for (int64_t j = 1; j < block; ++j) {
          float x = 0.0f;
          while (next < xs.size()) {
            x = xs[next++];
            if (std::fabs(x) <= anchor) break;
            x = 0.0f;
          }
          in.push_back(x);
        }
      }
    }
    const int64_t n = int64_t(in.size());
    Buffer src(f32(), {n});
    memcpy(src.t.data, in.data(), in.size() * sizeof(float));
    State st(kind, n);
    REQUIRE(lbopt_quantize(kind, mo, &src.t, st.view(), nullptr) == LBOPT_OK);
    d = d * 31 + (hash(*st.codes) ^ 3 * hash(*st.scales));
  }
  return d;
}

// Codes of xs, each quantized in a block of its own whose absmax is anchor (element 0); the block scales too.
std::vector<int> codes_of(lbopt_state_kind kind, lbopt_moment mo, const std::vector<float>& xs, float anchor,
                          float* scale = nullptr) {
  const int64_t bs = kind == LBOPT_STATE_4BIT ? 128 : 256, n = bs * int64_t(xs.size());
  Buffer src(f32(), {n});
  float* in = src.as<float>();
  std::fill(in, in + n, 0.0f);
  for (size_t i = 0; i < xs.size(); ++i) {
    in[int64_t(i) * bs] = anchor;
    in[int64_t(i) * bs + 1] = xs[i];
  }
  State st(kind, n);
  REQUIRE(lbopt_quantize(kind, mo, &src.t, st.view(), nullptr) == LBOPT_OK);
  if (scale) *scale = st.scales->as<float>()[0];
  std::vector<int> out;
  for (size_t i = 0; i < xs.size(); ++i) out.push_back(get_code(kind, *st.codes, int64_t(i) * bs + 1));
  return out;
}

// How many of the encodes that tell docs/formats.md's two roundings apart (x / s for 4-bit and FP8, x * RN(1 / s) for
// 8-bit) came out as the kind's own rounding; the count of those cases in *cases.
int documented_roundings(lbopt_state_kind kind, lbopt_moment mo, int* cases) {
  // The codes below top ascend in value (FP8: the positive ones below NaN).
  const int top = kind == LBOPT_STATE_4BIT ? 16 : kind == LBOPT_STATE_FP8 ? 127 : 256;
  const float unit = kind == LBOPT_STATE_FP8 ? 448.0f : 1.0f;  // the absmax of block scale 1
  const std::vector<float> values = code_values(kind, mo);
  // T[k]: the least float whose code is above k at scale 1, where both roundings are exact: found among the
  // floats around the midpoint of values k and k + 1 (skipped next to a zero value: the zero guard lifts codes)
  std::vector<int> ks;
  std::vector<float> thresholds;
  for (int k = 0; k + 1 < top; ++k) {
    if (values[size_t(k)] == 0.0f || values[size_t(k) + 1] == 0.0f) continue;
    std::vector<float> around;
    float y = 0.5f * (values[size_t(k)] + values[size_t(k) + 1]);
    for (int u = 0; u < 4; ++u) y = nextafterf(y, -INFINITY);
    for (int u = 0; u < 9; ++u, y = nextafterf(y, INFINITY)) around.push_back(y);
    const std::vector<int> codes = codes_of(kind, mo, around, unit);
    REQUIRE(codes.front() == k);
    REQUIRE(codes.back() == k + 1);
    ks.push_back(k);
    thresholds.push_back(around[size_t(std::find(codes.begin(), codes.end(), k + 1) - codes.begin())]);
  }
  int matched = 0;
  *cases = 0;
  for (float anchor : {3.0f, 0.7f, 1.37e-3f, 5.1f, 2.9e7f, 6.1e-9f, 123.456f}) {
    std::vector<float> xs;
    std::vector<int> want;
    const float s = kind == LBOPT_STATE_FP8 ? anchor / 448.0f : anchor;  // docs/formats.md's block scale
    for (size_t j = 0; j < ks.size(); ++j) {
      float x = thresholds[j] * s;
      for (int u = 0; u < 3; ++u) x = nextafterf(x, -INFINITY);
      for (int u = 0; u < 7; ++u, x = nextafterf(x, INFINITY)) {
        const bool up_div = x / s >= thresholds[j], up_mul = x * (1.0f / s) >= thresholds[j];
        if (up_div == up_mul || std::fabs(x) > anchor) continue;
        xs.push_back(x);
        want.push_back(ks[j] + ((kind == LBOPT_STATE_8BIT ? up_mul : up_div) ? 1 : 0));
      }
    }
    float scale = 0.0f;
    const std::vector<int> got = codes_of(kind, mo, xs, anchor, &scale);
    if (!xs.empty()) CHECK(scale == s);
    for (size_t i = 0; i < xs.size(); ++i) matched += got[i] == want[i];
    *cases += int(xs.size());
  }
  return matched;
}

}  // namespace

TEST_SUITE("simd") {
  TEST_CASE("every supported instruction set reproduces the portable kernels bit for bit") {
    struct Digests {
      uint64_t steps, scrambled, quantize, scaled, params;
    };
    const auto digests = [] {
      return Digests{all_cases(), scrambled_cases(), quantize_cases(), scaled_quantize_cases(), param_edge_cases()};
    };
    const Digests portable = with_portable_kernels(digests);
    for_each_simd_target([&](const std::string&) {
      const Digests simd = digests();
      CHECK(simd.steps == portable.steps);
      CHECK(simd.scrambled == portable.scrambled);
      CHECK(simd.quantize == portable.quantize);
      CHECK(simd.scaled == portable.scaled);
      CHECK(simd.params == portable.params);
    });
  }

  TEST_CASE("each kind encodes its documented quotient: x / s for 4-bit and FP8, x * RN(1 / s) for 8-bit") {
    const auto check = [] {
      for (lbopt_state_kind kind : {LBOPT_STATE_4BIT, LBOPT_STATE_8BIT, LBOPT_STATE_FP8})
        for (lbopt_moment mo : {LBOPT_MOMENT_FIRST, LBOPT_MOMENT_SECOND}) {
          CAPTURE(kind);
          CAPTURE(mo);
          int cases = 0;
          const int matched = documented_roundings(kind, mo, &cases);
          CHECK(cases >= 10);  // inputs whose two roundings give different codes were found
          CHECK(matched == cases);
        }
      return 0;
    };
    with_portable_kernels(check);
    for_each_simd_target([&](const std::string&) { check(); });
  }
}
