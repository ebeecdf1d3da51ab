// Stochastic rounding of a first moment's codes (quant.h's Codec::round_stochastic, LBOPT_FLAG_STATE_STOCHASTIC_ROUND)
// on each quantized kind: the code is y's nearest or the next one toward y, an exact value keeps its code, and over
// evenly spaced random bits the decoded mean is y (unbiased). And the random bits themselves (state_round_bits):
// uniform, and different per state, step and block.
#include <doctest/doctest.h>

#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "../../kernels/quant.h"

namespace {

using namespace lbopt;

// The values y to round: every code's value, points between neighbouring values, and a random sample, over the
// encode's range [-top, top].
template <class K>
std::vector<float> inputs(const Codec<K>& c, float top) {
  std::vector<float> ys;
  const uint32_t n = K::entries ? K::entries : 256;
  for (uint32_t code = 0; code < n; ++code) {
    if (K::id == kStateFp8 && (code & 0x7f) > 0x7e) continue;  // NaN codes
    const float v = K::decode_value(code, c.values);
    ys.push_back(v);
    const float w = K::decode_value(K::next_code(code, true), c.values);
    for (float t : {0.001f, 0.25f, 0.5f, 0.75f, 0.999f}) ys.push_back(v + t * (w - v));
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-top, top);
  for (int i = 0; i < 2000; ++i) ys.push_back(u(rng));
  return ys;
}

// For each y: every code of 4096 evenly spaced r is y's nearest code or the next toward y, exact values keep their
// code, and the mean decoded value is y to within the sweep's resolution. Returns the cases that fail.
template <class K>
int check_kind(float top) {
  const Codec<K> c = host_codec<K>(kMomentFirst);
  const auto b = c.block_scale(top);  // scale 1: the decoded values are the map's
  REQUIRE(b.scale == 1.0f);
  constexpr int kSweep = 4096;
  int bad = 0;
  for (const float y : inputs(c, top)) {
    const uint32_t near = c.encode(y, b);
    const float v = K::decode_value(near, c.values);
    const uint32_t toward = y == v ? near : K::next_code(near, y > v);
    const float w = K::decode_value(toward, c.values);
    double sum = 0;
    bool in_bracket = true;
    for (int j = 0; j < kSweep; ++j) {
      const uint32_t r = uint32_t(j) << 20 | 0x80000u;  // u = (j + 1/2) / 4096
      const uint32_t code = c.round_stochastic(near, y, b.scale, r);
      in_bracket &= code == near || code == toward;
      sum += K::decode_value(code, c.values);
    }
    const double mean = sum / kSweep;
    // where y lies beyond the map's last value (the signed 4-bit map ends at -0.8875), the nearest code is the end
    const bool beyond = toward == near && y != v;
    const double want = beyond ? double(v) : double(y);
    const bool unbiased = fabs(mean - want) <= fabs(double(w) - double(v)) / kSweep + 1e-6 * fabs(double(y));
    if ((!in_bracket || !unbiased) && bad++ < 5)
      MESSAGE(std::string(K::name) << ": y = " << y << " nearest " << v << " next " << w << " mean " << mean
                      << (in_bracket ? std::string() : std::string(" (a code outside the bracket)")));
  }
  return bad;
}

}  // namespace

TEST_SUITE("unit") {
  TEST_CASE("stochastic code rounding: one of the two codes around y, exact values kept, unbiased") {
    CHECK(check_kind<Kind4Bit>(1.0f) == 0);
    CHECK(check_kind<Kind8Bit>(1.0f) == 0);
    CHECK(check_kind<KindFp8>(448.0f) == 0);
  }

  TEST_CASE("stochastic code rounding: a value between two codes moves toward the farther one in proportion") {
    // 0.25 of the way from a code to the next: a quarter of the sweep takes the next code
    const Codec<Kind4Bit> c = host_codec<Kind4Bit>(kMomentFirst);
    const float v = c.values[9], w = c.values[10];
    const float y = v + 0.25f * (w - v);
    int next = 0;
    for (uint32_t j = 0; j < 4096; ++j) next += c.round_stochastic(9, y, 1.0f, j << 20 | 0x80000u) == 10;
    CHECK(next >= 1020);
    CHECK(next <= 1028);
  }

  TEST_CASE("stochastic FP8 codes: up exactly where the random fraction and y's place reach the next code") {
    // An independent reference in double: y's magnitude lies at fraction t of the step from the code below it
    // (the largest e4m3 value <= |y|) to the next; R / 2^20 (R: the top 20 random bits) + t >= 1 takes the next.
    // r values within 2^-19 of the boundary are skipped (the rule rounds y's place to 2^-20 of a step).
    const Codec<KindFp8> c = host_codec<KindFp8>(kMomentFirst);
    std::vector<double> mags;
    for (uint32_t code = 0; code <= 0x7e; ++code) mags.push_back(double(KindFp8::decode_value(code, nullptr)));
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> exponent(-12.0f, 8.8f);
    int checked = 0, bad = 0;
    for (int n = 0; n < 20000; ++n) {
      const float y = (n & 1 ? -1.0f : 1.0f) * exp2f(exponent(rng));
      const double a = std::min(fabs(double(y)), 448.0);
      uint32_t lo = 0;
      while (lo < 0x7e && mags[lo + 1] <= a) ++lo;
      const double t = lo == 0x7e ? 0.0 : (a - mags[lo]) / (mags[lo + 1] - mags[lo]);
      const uint32_t r = uint32_t(rng());
      const double u = double(r >> 12) * 0x1p-20;
      if (fabs(u + t - 1.0) < 0x1p-19) continue;
      const uint32_t want = (y < 0 ? 0x80u : 0u) | (u + t >= 1.0 ? lo + 1 : lo);
      ++checked;
      if (c.round_stochastic(0, y, 1.0f, r) != want && bad++ < 5)
        MESSAGE("y = " << y << " r = " << r << " want " << want << " got " << c.round_stochastic(0, y, 1.0f, r));
    }
    CHECK(checked > 19000);
    CHECK(bad == 0);
  }

  TEST_CASE("state_round_bits: uniform top bits, and other bits for each state, step and block") {
    // 16 bins of the top 4 bits over 2^20 elements of 4096 blocks: chi-square with 15 degrees of freedom
    int64_t bins[16] = {};
    for (int64_t blk = 0; blk < 4096; ++blk) {
      const uint32_t key = state_round_key(7, 3, 0, blk);
      for (uint32_t i = 0; i < 256; ++i) ++bins[state_round_bits(key, i) >> 28];
    }
    double chi2 = 0;
    const double expect = double(1 << 20) / 16;
    for (int64_t n : bins) chi2 += (double(n) - expect) * (double(n) - expect) / expect;
    CHECK(chi2 < 40.0);  // p ~ 5e-4 for a fair generator
    // the key depends on every input
    const uint32_t k = state_round_key(7, 3, 0, 5);
    CHECK(k != state_round_key(8, 3, 0, 5));
    CHECK(k != state_round_key(7, 4, 0, 5));
    CHECK(k != state_round_key(7, 3, 1, 5));
    CHECK(k != state_round_key(7, 3, 0, 6));
    // neighbouring elements of a block agree in their top bit half of the time
    int same = 0;
    for (uint32_t i = 0; i < 4096; ++i) same += (state_round_bits(k, i) >> 31) == (state_round_bits(k, i + 1) >> 31);
    CHECK(same > 1900);
    CHECK(same < 2200);
  }
}
