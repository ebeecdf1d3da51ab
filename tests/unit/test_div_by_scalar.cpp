// div_by_reciprocal (kernels/optimizers.h), the GPU's division by a per-step scalar without a divide, against
// IEEE division: every significand of x in binades at both ends of its exact range and inside it, for divisors
// across theirs, random pairs over the range, and the special values; and reciprocal_rn against the definition of
// round-to-nearest.
#include <doctest/doctest.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "../../kernels/optimizers.h"

namespace {

float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// Divisors across [2^-27, 2^27]: AdamW's sqrt(1 - beta2^step) for common betas, powers of two, random floats.
std::vector<float> divisors() {
  std::vector<float> out = {1.0f, 0x1p-27f, 0x1p27f, nextafterf(1.0f, 0.0f), 3.0f, 0.1f};
  for (const double beta2 : {0.999, 0.95})
    for (const int64_t step : {1, 1000}) out.push_back(float(pow(lbopt::bias_correction(beta2, step), 0.5)));
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> exponent(-27.0f, 27.0f);
  for (int i = 0; i < 4; ++i) out.push_back(exp2f(exponent(rng)));
  return out;
}

float quotient(float x, float c) {
  return lbopt::div_by_reciprocal(x, c, lbopt::reciprocal_rn(c));
}

// Mismatches (bitwise) against x / c over every significand of the binade [2^e, 2^(e+1)) (the sequence is odd in x:
// round-to-nearest is symmetric).
int64_t binade_mismatches(float c, int e) {
  std::atomic<int64_t> bad{0};
  const auto part = [&](uint32_t first, uint32_t last) {
    int64_t local = 0;
    for (uint32_t m = first; m < last; ++m) {
      const float x = from_bits((uint32_t(e + 127) << 23) | m);
      const float want = x / c, got = quotient(x, c);
      if (memcmp(&want, &got, sizeof want) != 0 && local++ < 2)
        MESSAGE("x = " << x << " c = " << c << ": " << got << " against " << want);
    }
    bad += local;
  };
  constexpr uint32_t kHalf = 1u << 22;
  std::thread t(part, 0u, kHalf);
  part(kHalf, 2 * kHalf);
  t.join();
  return bad;
}

}  // namespace

TEST_CASE("reciprocal_rn is the float nearest 1 / c") {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits((uint32_t(127 - 60) << 23), (uint32_t(127 + 60) << 23));
  int bad = 0;
  for (int i = 0; i < 2000000; ++i) {
    const float c = from_bits(bits(rng)), r = lbopt::reciprocal_rn(c);
    // r is RN(1 / c) iff |1 / c - r| < ulp(r) / 2, i.e. |1 - r c| < ulp(r) c / 2 (both sides exact in double;
    // ulp(r) is that of r's binade, and 1 / c lies at no midpoint)
    int e;
    frexpf(r, &e);
    const double half_ulp_c = ldexp(double(c), e - 25);
    if (!(fabs(1.0 - double(r) * double(c)) < half_ulp_c) && bad++ < 3) MESSAGE("c = " << c << ": r = " << r);
  }
  CHECK(bad == 0);
}

TEST_CASE("div_by_reciprocal equals IEEE division over every significand, at the ends of its range and inside") {
  // x in [2^-99, 2^100) and c in [2^-27, 2^27]: every quotient in [2^-126, 2^127)
  int64_t bad = 0;
  for (const float c : divisors())
    for (const int e : {-99, 0, 99}) bad += binade_mismatches(c, e);
  CHECK(bad == 0);
}

TEST_CASE("div_by_reciprocal equals IEEE division on random pairs over its whole range") {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> ex(-99.0f, 100.0f), ec(-27.0f, 27.0f);
  std::uniform_int_distribution<uint32_t> significand(0, (1u << 23) - 1);
  int bad = 0;
  for (int i = 0; i < 4000000; ++i) {
    const float c = exp2f(ec(rng));
    const float x = from_bits((uint32_t(int(floorf(ex(rng))) + 127) << 23) | significand(rng));
    const float q = x / c;
    if (!(fabsf(q) >= 0x1p-126f && fabsf(q) < INFINITY)) continue;  // outside the range
    if (quotient(x, c) != q && bad++ < 3) MESSAGE("x = " << x << " c = " << c);
  }
  CHECK(bad == 0);
}

TEST_CASE("div_by_reciprocal of the special values") {
  for (const float c : {1.0f, 0.031622775f, 0x1p-30f}) {
    CHECK(quotient(INFINITY, c) == INFINITY);
    CHECK(quotient(-INFINITY, c) == -INFINITY);
    CHECK(quotient(-1.5f, c) == -1.5f / c);
    CHECK(isnan(quotient(NAN, c)));
    const float zero = quotient(0.0f, c);
    CHECK((zero == 0.0f && !signbit(zero)));
  }
}
