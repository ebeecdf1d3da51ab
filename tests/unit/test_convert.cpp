// Param dtype conversions and the random bits of stochastic rounding, against independent definitions.
#include <doctest/doctest.h>

#include <math.h>

#include <random>

#include "../../kernels/dtype_convert.h"
#include "reference.h"

using namespace lbopt;

TEST_SUITE("dtype conversion") {
  TEST_CASE("float16: every half decodes exactly and re-encodes to itself") {
    for (uint32_t h = 0; h < 65536; ++h) {
      const double want = ref::load(ref::kF16, &h, 0);  // little-endian: the low half of h
      const float got = f16_to_float(uint16_t(h));
      CAPTURE(h);
      if (isnan(want)) {
        CHECK(isnan(got));
        CHECK(isnan(f16_to_float(float_to_f16(got))));
      } else {
        CHECK(double(got) == want);
        CHECK(float_to_f16(got) == h);
      }
    }
  }

  TEST_CASE("float16 and bfloat16 encoding is round-to-nearest-even, against the compiler and the reference") {
    std::mt19937 rng(1);
    std::uniform_int_distribution<uint32_t> ub;
    for (int i = 0; i < 2000000; ++i) {
      uint32_t u = ub(rng);
      if (i % 2) u = (u & 0x8fffffffu) | 0x30000000u;  // half the samples near the float16 range
      const float x = bits_float(u);
      if (isnan(x)) continue;
      CAPTURE(x);
      // _Float16 conversions in GCC are IEEE round-to-nearest-even, overflow to infinity
      const _Float16 h = _Float16(x);
      uint16_t hb;
      memcpy(&hb, &h, 2);
      REQUIRE(float_to_f16(x) == hb);
      if (fabs(x) < 3.3e38f) {
        const double want = ref::round_to_format(x, 8, -126);
        REQUIRE(double(bf16_to_float(float_to_bf16(x))) == want);
      }
    }
    CHECK(isnan(bf16_to_float(float_to_bf16(NAN))));
    CHECK(isinf(bf16_to_float(float_to_bf16(INFINITY))));
    CHECK(float_to_f16(65520.0f) == 0x7c00);  // past the largest half: infinity
    CHECK(float_to_f16(65519.0f) == 0x7bff);
  }

  TEST_CASE("bfloat16 stochastic rounding rounds up for exactly the fraction of r below the dropped bits") {
    for (uint32_t low : {0u, 1u, 0x4000u, 0x8000u, 0xffffu}) {
      const float x = bits_float(0x3f800000u | low);  // 1.0 plus `low` in the dropped half
      uint32_t up = 0;
      for (uint32_t r = 0; r < 65536; ++r) up += float_to_bf16_stochastic(x, r) == 0x3f81;
      CHECK(up == low);  // E[result] == x exactly
    }
    CHECK(float_to_bf16_stochastic(bits_float(0x3f80ffffu), 0) == 0x3f81);
    CHECK(isnan(bf16_to_float(float_to_bf16_stochastic(NAN, 0))));
  }

  TEST_CASE("counter-based random bits: deterministic, distinct across keys, uniform") {
    CHECK(random_bits(1, 2, 3) == random_bits(1, 2, 3));
    CHECK(random_bits(1, 2, 3) != random_bits(2, 2, 3));
    CHECK(random_bits(1, 2, 3) != random_bits(1, 3, 3));
    CHECK(random_bits(1, 2, 3) != random_bits(1, 2, 4));
    double mean = 0;
    int64_t below = 0;
    const int n = 1 << 20;
    for (int i = 0; i < n; ++i) {
      const uint32_t r = random_bits(7, 1, uint64_t(i)) & 0xffffu;
      mean += r;
      below += r < 0x4000u;
    }
    CHECK(mean / n == doctest::Approx(32767.5).epsilon(0.005));
    CHECK(double(below) / n == doctest::Approx(0.25).epsilon(0.01));
  }
}
