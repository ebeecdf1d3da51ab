// The 4-bit encode by thresholds on x (kernels/encode_in_x.h, the CUDA kernels' encode) against the division and
// search of quant.h's Codec, which the portable kernels run: for both 4-bit maps, at scales across the float range,
// every float within 4 ulps of each threshold (where a code changes) and a random sample of [-s, s].
#include <doctest/doctest.h>

#include <math.h>
#include <stdint.h>

#include <random>
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

// Mismatches of codebook_encode(T, 16, x) against the codec's encode of x, for the x given.
int mismatches(const lbopt::Codec<Kind4Bit>& codec, float s, const float (&t)[16], const std::vector<float>& xs) {
  const auto scale = codec.block_scale(s);
  REQUIRE(scale.scale == s);
  int bad = 0;
  for (const float x : xs) {
    const uint32_t want = codec.encode(x, scale), got = lbopt::codebook_encode(t, 16, x);
    if (want != got && bad++ < 3) MESSAGE("x = " << x << " s = " << s << ": " << got << " against " << want);
  }
  return bad;
}

}  // namespace

TEST_CASE("4-bit codes of x by thresholds equal those of x / s, both maps, every scale") {
  std::mt19937 rng(11);
  for (const bool second : {false, true}) {
    const lbopt::Codec<Kind4Bit> codec = lbopt::host_codec<Kind4Bit>(second);
    int bad = 0;
    for (const float s : scales()) {
      float t[16];
      for (int k = 0; k < 16; ++k) t[k] = lbopt::threshold_in_x(codec.mids, k, s);
      std::vector<float> xs = {0.0f, -0.0f, s, -s, 1e-45f, -1e-45f};
      for (int k = 0; k < 15; ++k) {  // every float within 4 ulps of each threshold
        float x = t[k];
        for (int u = 0; u < 4; ++u) x = nextafterf(x, -INFINITY);
        for (int u = 0; u < 9; ++u, x = nextafterf(x, INFINITY)) xs.push_back(x);
      }
      std::uniform_real_distribution<float> inside(-s, s);
      for (int i = 0; i < 200; ++i) xs.push_back(inside(rng));
      bad += mismatches(codec, s, t, xs);
    }
    CHECK_MESSAGE(bad == 0, (second ? "unsigned" : "signed") << " map");
  }
}

TEST_CASE("a threshold is the least float whose quotient reaches its midpoint") {
  const lbopt::Codec<Kind4Bit> codec = lbopt::host_codec<Kind4Bit>(false);
  for (const float s : {0.75f, 1.0f, 1e-9f}) {
    for (int k = 0; k < 15; ++k) {
      const float t = lbopt::threshold_in_x(codec.mids, k, s);
      CHECK(t / s >= codec.mids[k]);
      CHECK(nextafterf(t, -INFINITY) / s < codec.mids[k]);
    }
    CHECK(isinf(lbopt::threshold_in_x(codec.mids, 15, s)));
  }
  for (const bool second : {false, true}) {  // what threshold_in_x assumes of the midpoints
    const float* mids = lbopt::host_codec<Kind4Bit>(second).mids;
    for (int k = 0; k < 15; ++k) CHECK((isfinite(mids[k]) && mids[k] != 0.0f));
    CHECK(isinf(mids[15]));
  }
}
