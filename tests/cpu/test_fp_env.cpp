// The caller's floating-point environment does not reach the results: a host that flushes denormals (XLA runs its
// threads with FTZ/DAZ) or rounds upward gets the same bits as the default environment, and gets its own
// environment back.
#include <doctest/doctest.h>

#include <fenv.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define LBOPT_TEST_MXCSR 1
#else
#define LBOPT_TEST_MXCSR 0
#endif

#include <random>

#include "harness.h"

using namespace test;

namespace {

// Three steps of every kind (AMSGrad, float32 params, so that an ulp of a scalar shows), with a callback that sets
// the environment around each call.
uint64_t run(lbopt_state_kind kind, void (*enter)(), void (*leave)()) {
  lbopt_adamw_config cfg;
  lbopt_adamw_config_init(&cfg, sizeof cfg);
  cfg.state_kind = kind;
  cfg.flags = LBOPT_FLAG_AMSGRAD;
  const int64_t n = 5000;
  Buffer p(f32(), {n}), g(f32(), {n}), back(f32(), {n});
  State m(kind, n), v(kind, n), vmax(kind, n);
  for (State* st : {&m, &v, &vmax}) REQUIRE(lbopt_state_init(kind, n, st->view(), nullptr) == LBOPT_OK);
  std::mt19937_64 rng(31);
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < n; ++i) p.as<float>()[i] = nd(rng);
  for (int64_t s = 1; s <= 3; ++s) {
    for (int64_t i = 0; i < n; ++i) g.as<float>()[i] = 0.01f * nd(rng);
    const lbopt_adamw_slot slot{sizeof slot, &p.t, &g.t, m.view(), v.view(), vmax.view(), s};
    enter();
    const lbopt_status st = lbopt_adamw_step(&cfg, 1e-2 / double(s), &slot, 1, nullptr);
    leave();
    REQUIRE(st == LBOPT_OK);
  }
  enter();
  REQUIRE(lbopt_dequantize(kind, LBOPT_MOMENT_FIRST, m.view(), &back.t, nullptr) == LBOPT_OK);
  leave();
  return hash(p) ^ 3 * hash(*m.codes) ^ 5 * hash(*v.codes) ^ 7 * hash(back);
}

void nothing() {}

}  // namespace

TEST_SUITE("floating-point environment") {
  TEST_CASE("an upward rounding mode does not change the results and is given back") {
    for (int k = 0; k < 4; ++k) {
      CAPTURE(k);
      const uint64_t want = run(lbopt_state_kind(k), nothing, nothing);
      static int seen;
      const uint64_t got = run(lbopt_state_kind(k), [] { fesetround(FE_UPWARD); },
                               [] { seen = fegetround(); fesetround(FE_TONEAREST); });
      CHECK(seen == FE_UPWARD);
      CHECK(got == want);
    }
  }

#if LBOPT_TEST_MXCSR
  TEST_CASE("flushed denormals (FTZ/DAZ, as XLA's threads) do not change the results and are given back") {
    for (int k = 0; k < 4; ++k) {
      CAPTURE(k);
      const uint64_t want = run(lbopt_state_kind(k), nothing, nothing);
      static unsigned seen;
      const uint64_t got = run(lbopt_state_kind(k), [] { _mm_setcsr(_mm_getcsr() | 0x8040u); },
                               [] { seen = _mm_getcsr(); _mm_setcsr(seen & ~0x8040u); });
      CHECK((seen & 0x8040u) == 0x8040u);
      CHECK(got == want);
    }
  }
#endif
}
