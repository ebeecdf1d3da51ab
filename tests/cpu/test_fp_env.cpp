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

#include "harness.h"

using namespace test;

namespace {

// Three steps of every kind (AMSGrad, bf16 params), with a callback that sets the environment around each call.
uint64_t run(lbopt_state_kind kind, void (*enter)(), void (*leave)()) {
  lbopt_adamw_config cfg;
  lbopt_adamw_config_init(&cfg, sizeof cfg);
  cfg.state_kind = kind;
  cfg.flags = LBOPT_FLAG_AMSGRAD;
  StepTensors t(kind, 5000, 31);
  for (int64_t s = 1; s <= 3; ++s) {
    const lbopt_adamw_slot slot = t.slot(s, true);
    enter();
    const lbopt_status st = lbopt_adamw_step(&cfg, 1e-2, &slot, 1, nullptr);
    leave();
    REQUIRE(st == LBOPT_OK);
  }
  Buffer back(f32(), {5000});
  enter();
  REQUIRE(lbopt_dequantize(kind, LBOPT_MOMENT_FIRST, t.m.view(), &back.t, nullptr) == LBOPT_OK);
  leave();
  return t.digest() ^ 19 * hash(back);
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
