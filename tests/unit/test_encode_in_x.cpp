// The 4-bit encode by thresholds on x (kernels/encode_in_x.h, the CUDA kernels' encode) against the division and
// search of quant.h's Codec, which the portable kernels run: for both 4-bit maps, at scales across the float range,
// every float within 4 ulps of each threshold (where a code changes) and of each bucket edge of the signed
// candidate (where the candidate changes), a sweep of every binade, and a random sample of [-s, s].
#include <doctest/doctest.h>

#include <math.h>
#include <stdint.h>

#include <random>
#include <string>
#include <vector>

#include "../../kernels/encode_in_x.h"
#include "../../kernels/quant.h"

namespace {

using lbopt::Kind4Bit;

// The scales a 4-bit block can have: its absmax, at least 1e-12.
std::vector<float> scales() {
  std::vector<float> out = {1e-12f, 1e-6f, 0.5f, 1.0f, 1.5f, 3.0f, 1e3f, 1e20f, 3.4e38f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-40.0f, 127.0f);
  for (int i = 0; i < 400; ++i) out.push_back(fmaxf(1e-12f, exp2f(exponent(rng))));
  return out;
}

// The floats x in [-s, s] where a code or a candidate may change, and a sample of the rest.
std::vector<float> probes(float s, const float (&t)[16], std::mt19937& rng) {
  std::vector<float> xs = {0.0f, -0.0f, s, -s, 1e-45f, -1e-45f};
  const auto around = [&](float x) {  // every float within 4 ulps of x, both signs
    for (int u = 0; u < 4; ++u) x = nextafterf(x, -INFINITY);
    for (int u = 0; u < 9; ++u, x = nextafterf(x, INFINITY))
      if (fabsf(x) <= s) {
        xs.push_back(x);
        xs.push_back(-x);
      }
  };
  for (int k = 0; k < 15; ++k) around(t[k]);
  // the signed candidate's bucket edges: the |x| with |x| r + 2^-8 = 2^e (1 + q / 4)
  const double r = double(float(lbopt::encode4::kBucketC) / s);
  for (int e = -8; e < 0; ++e)
    for (int q = 0; q < 4; ++q) around(float((ldexp(1.0 + q / 4.0, e) - 0x1p-8) / r));
  for (int e = -149; e < 128; ++e)  // a sweep of each binade up to s
    for (int k = 0; k < 64; ++k) {
      const float x = float(ldexp(1.0 + k / 64.0 + 1.0 / 4096.0, e));
      if (x <= s) {
        xs.push_back(x);
        xs.push_back(-x);
      }
    }
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);  // s * unit: (-s, s) would overflow at the largest s
  for (int i = 0; i < 200; ++i) xs.push_back(s * unit(rng));
  return xs;
}

// Mismatches against the codec's encode of x, for the x given, of the codes by thresholds: the search over them,
// and the candidate and one compare.
int mismatches(const lbopt::Codec<Kind4Bit>& codec, float s, const float (&t)[16], const std::vector<float>& xs) {
  const auto scale = codec.block_scale(s);
  REQUIRE(scale.scale == s);
  float row[lbopt::kInXRow];
  lbopt::in_x_fixed_entries(row);
  for (int k = 0; k < 16; ++k) row[lbopt::in_x_entry(k)] = lbopt::in_x_value(codec.mids, codec.unsigned_map, k, s);
  int bad = 0;
  for (const float x : xs) {
    const uint32_t want = codec.encode(x, scale), searched = codec.guard_zero(lbopt::codebook_encode(t, 16, x), x);
    const uint32_t candidate = codec.guard_zero(
        codec.unsigned_map ? lbopt::encode_linear_in_x(x, row)
                           : lbopt::encode_signed_in_x(x, row, lbopt::encode4::kSignedBuckets.first),
        x);
    if ((want != searched || want != candidate) && bad++ < 3)
      MESSAGE("x = " << x << " s = " << s << ": " << searched << " (search), " << candidate
                     << " (candidate) against " << want);
  }
  return bad;
}

}  // namespace

TEST_CASE("4-bit codes of x by thresholds equal those of x / s, every map and moment, every scale") {
  std::mt19937 rng(11);
  for (const lbopt::Moment moment : {lbopt::kMomentFirst, lbopt::kMomentSecond, lbopt::kMomentSecondSigned}) {
    const lbopt::Codec<Kind4Bit> codec = lbopt::host_codec<Kind4Bit>(moment);
    int bad = 0;
    for (const float s : scales()) {
      float t[16];  // the thresholds, +inf for the missing midpoint 15
      for (int k = 0; k < 16; ++k) t[k] = k < 15 ? lbopt::threshold_of_midpoint(codec.mids[k], s) : INFINITY;
      bad += mismatches(codec, s, t, probes(s, t, rng));
    }
    CHECK_MESSAGE(bad == 0, "moment " << int(moment));
  }
}

TEST_CASE("a threshold is the least float whose quotient reaches its midpoint") {
  const lbopt::Codec<Kind4Bit> codec = lbopt::host_codec<Kind4Bit>(lbopt::kMomentFirst);
  for (const float s : {0.75f, 1.0f, 1e-9f}) {
    for (int k = 0; k < 15; ++k) {
      const float t = lbopt::threshold_of_midpoint(codec.mids[k], s);
      CHECK(t / s >= codec.mids[k]);
      CHECK(nextafterf(t, -INFINITY) / s < codec.mids[k]);
    }
  }
  for (const lbopt::Moment moment : {lbopt::kMomentFirst, lbopt::kMomentSecond}) {  // threshold_of_midpoint's premise
    const float* mids = lbopt::host_codec<Kind4Bit>(moment).mids;
    for (int k = 0; k < 15; ++k) CHECK((isfinite(mids[k]) && mids[k] != 0.0f));
    CHECK(isinf(mids[15]));
  }
}

TEST_CASE("the GPU's threshold terms sum exactly to h * s, so its one rounding up gives the same threshold") {
  // The device computes T = RU(below * s + tail) in one fused multiply-add (threshold_terms); the host rounds the
  // exact double h * s up. Both round the same real number iff below * s + tail == h * s exactly, which long double
  // (64-bit significands) holds without rounding: below * s has 48 significant bits, tail lies within them.
  int bad = 0;
  for (const lbopt::Moment moment : {lbopt::kMomentFirst, lbopt::kMomentSecond}) {
    const float* mids = lbopt::host_codec<Kind4Bit>(moment).mids;
    for (const float s : scales())
      for (int k = 0; k < 15; ++k) {
        const lbopt::ThresholdTerms t = lbopt::threshold_terms(mids[k], s);
        const long double sum = static_cast<long double>(t.below) * s + t.tail;
        const long double want = static_cast<long double>(lbopt::midpoint_in_quotients(mids[k])) * s;
        const bool tail_exact = static_cast<long double>(t.tail) ==
                                (static_cast<long double>(mids[k]) - t.below) * 0.5L * s;
        if ((sum != want || !tail_exact) && bad++ < 3) MESSAGE("midpoint " << k << ", s = " << s);
      }
  }
  CHECK(bad == 0);
}
