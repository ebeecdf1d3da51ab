// Non-finite gradients and AMP: a NaN or Inf never reaches a quantized state.
#include <doctest/doctest.h>

#include <math.h>

#include <random>

#include "harness.h"

using namespace test;

namespace {

struct Model {
  lbopt_state_kind kind;
  Buffer p0, g0, p1, g1;
  State m0, v0, m1, v1;
  Model(lbopt_state_kind k, int64_t n0, int64_t n1)
      : kind(k), p0(bf16(), {n0}), g0(f32(), {n0}), p1(f32(), {n1}), g1(f16(), {n1}), m0(k, n0), v0(k, n0), m1(k, n1),
        v1(k, n1) {
    std::mt19937_64 rng(3);
    std::normal_distribution<double> nd;
    for (int64_t i = 0; i < n0; ++i) {
      store(ref::kBF16, p0.t.data, i, ref::to_dtype(ref::kBF16, nd(rng)));
      g0.as<float>()[i] = float(0.01 * nd(rng));
    }
    for (int64_t i = 0; i < n1; ++i) {
      p1.as<float>()[i] = float(nd(rng));
      store(ref::kF16, g1.t.data, i, ref::to_dtype(ref::kF16, 0.01 * nd(rng)));
    }
  }
  std::vector<lbopt_adamw_slot> slots(int64_t step) {
    return {{sizeof(lbopt_adamw_slot), &p0.t, &g0.t, m0.view(), v0.view(), {nullptr, nullptr}, step},
            {sizeof(lbopt_adamw_slot), &p1.t, &g1.t, m1.view(), v1.view(), {nullptr, nullptr}, step}};
  }
  uint64_t hash0() const { return hash(p0) ^ 3 * hash(*m0.codes) ^ 5 * hash(*v0.codes) ^ 7 * hash(*m0.scales); }
  uint64_t hash1() const { return hash(p1) ^ 3 * hash(*m1.codes) ^ 5 * hash(*v1.codes) ^ 7 * hash(*m1.scales); }
};

lbopt_status step(Model& md, uint32_t flags, const lbopt_step_options* opts, int64_t step = 1) {
  lbopt_adamw_config cfg;
  lbopt_adamw_config_init(&cfg, sizeof cfg);
  cfg.state_kind = md.kind;
  cfg.flags = flags;
  std::vector<lbopt_adamw_slot> s = md.slots(step);
  return lbopt_adamw_step(&cfg, 1e-3, s.data(), s.size(), opts);
}

bool all_finite(const Buffer& b) {
  for (int64_t i = 0; i < b.numel(); ++i)
    if (!isfinite(b.as<float>()[i])) return false;
  return true;
}

}  // namespace

TEST_SUITE("non-finite gradients") {
  TEST_CASE("skip-non-finite leaves the affected slot bit-identical, steps the others, and reports it") {
    for (int kind = 0; kind < 3; ++kind)
      for (float bad : {NAN, INFINITY, -INFINITY}) {
        CAPTURE(kind);
        CAPTURE(bad);
        Model md(lbopt_state_kind(kind), 1000, 333);
        REQUIRE(step(md, 0, nullptr) == LBOPT_OK);  // non-trivial states first
        md.g0.as<float>()[517] = bad;
        const uint64_t before0 = md.hash0(), before1 = md.hash1();
        Buffer skipped(u8(), {2});
        skipped.as<uint8_t>()[0] = skipped.as<uint8_t>()[1] = 7;
        lbopt_step_options opts;
        lbopt_step_options_init(&opts, sizeof opts);
        opts.skipped = &skipped.t;
        REQUIRE(step(md, LBOPT_FLAG_SKIP_NONFINITE, &opts, 2) == LBOPT_OK);
        CHECK(md.hash0() == before0);
        CHECK(md.hash1() != before1);
        CHECK(skipped.as<uint8_t>()[0] == 1);
        CHECK(skipped.as<uint8_t>()[1] == 0);
      }
  }

  TEST_CASE("without the flag a NaN reaches the param (as in torch) but never a quantized state") {
    for (int kind = 0; kind < 3; ++kind) {
      CAPTURE(kind);
      Model md(lbopt_state_kind(kind), 1000, 333);
      md.g0.as<float>()[5] = NAN;
      md.g0.as<float>()[900] = INFINITY;
      REQUIRE(step(md, 0, nullptr) == LBOPT_OK);
      CHECK(isnan(bf16_value(md.p0, 5)));
      CHECK(all_finite(*md.m0.scales));
      CHECK(all_finite(*md.v0.scales));
      // the other elements of the poisoned blocks still carry their state
      Buffer deq(f32(), {1000});
      REQUIRE(lbopt_dequantize(lbopt_state_kind(kind), LBOPT_MOMENT_FIRST, md.m0.view(), &deq.t, nullptr) == LBOPT_OK);
      CHECK(deq.as<float>()[5] == 0.0f);
      CHECK(deq.as<float>()[6] != 0.0f);
      CHECK(all_finite(deq));
      // and a later finite step is finite everywhere except the param element that already was NaN
      md.g0.as<float>()[5] = 0.0f;
      md.g0.as<float>()[900] = 0.0f;
      REQUIRE(step(md, 0, nullptr, 2) == LBOPT_OK);
      CHECK(all_finite(*md.m0.scales));
      CHECK(isfinite(bf16_value(md.p0, 6)));
    }
  }

  TEST_CASE("AMP: found_inf set writes nothing and marks every slot skipped; grad_scale divides the grads") {
    Model md(LBOPT_STATE_4BIT, 1000, 333);
    Buffer found(f32(), {1}), scale(f32(), {1}), skipped(u8(), {2});
    found.as<float>()[0] = 1.0f;
    lbopt_step_options opts;
    lbopt_step_options_init(&opts, sizeof opts);
    opts.found_inf = &found.t;
    opts.skipped = &skipped.t;
    const uint64_t before0 = md.hash0(), before1 = md.hash1();
    REQUIRE(step(md, 0, &opts) == LBOPT_OK);
    CHECK(md.hash0() == before0);
    CHECK(md.hash1() == before1);
    CHECK(skipped.as<uint8_t>()[0] == 1);
    CHECK(skipped.as<uint8_t>()[1] == 1);

    // grads scaled by 1024 with grad_scale 1024 give the unscaled step bit for bit (1024 is a power of two)
    Model plain(LBOPT_STATE_4BIT, 1000, 333), scaled(LBOPT_STATE_4BIT, 1000, 333);
    for (int64_t i = 0; i < 1000; ++i) scaled.g0.as<float>()[i] *= 1024.0f;
    for (int64_t i = 0; i < 333; ++i) {
      const double g = ref::load(ref::kF16, plain.g1.t.data, i) * 1024.0;
      store(ref::kF16, scaled.g1.t.data, i, g);
    }
    found.as<float>()[0] = 0.0f;
    scale.as<float>()[0] = 1024.0f;
    opts.grad_scale = &scale.t;
    REQUIRE(step(plain, 0, nullptr) == LBOPT_OK);
    REQUIRE(step(scaled, 0, &opts) == LBOPT_OK);
    CHECK(plain.hash0() == scaled.hash0());
    CHECK(plain.hash1() == scaled.hash1());
    CHECK(skipped.as<uint8_t>()[0] == 0);

    scale.as<float>()[0] = 0.0f;  // a zero scale is refused before anything is written
    const uint64_t h = scaled.hash0();
    CHECK(step(scaled, 0, &opts) == LBOPT_ERR_INVALID_VALUE);
    CHECK(scaled.hash0() == h);
  }
}
