// The library's step against the independent double-precision reference (tests/support/reference.h).
#include <doctest/doctest.h>

#include <math.h>

#include <random>
#include <string>

#include "harness.h"

using namespace test;

namespace {

const char* kind_name(lbopt_state_kind k) {
  static const char* names[] = {"4bit", "8bit", "fp8", "fp32"};
  return names[k];
}

struct Setup {
  lbopt_state_kind kind;
  ref::Dtype pdt, gdt;
  int64_t numel;
  uint32_t flags;
};

struct Outcome {
  double max_param_rel = 0;     // float32 params, relative to the size of the terms
  int64_t param_ulp_flips = 0;  // 16-bit params: elements one ulp off the reference rounding
  int64_t code_flips = 0;       // codes one step off (near ties)
  int64_t far_codes = 0;        // codes more than one step off: never allowed
  int64_t codes_total = 0;
  double max_scale_rel = 0;
  double max_plain_rel = 0;     // FP32 kind states
};

// Both sides take one step from the same random param, grad and states; returns how far they ended apart.
Outcome one_step(const Setup& s, uint64_t seed, int64_t step) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> np(0.0, 0.1), ng(0.0, 0.01);
  const bool ams = s.flags & LBOPT_FLAG_AMSGRAD;
  Buffer param(dl_dtype(s.pdt), {s.numel}), grad(dl_dtype(s.gdt), {s.numel});
  std::vector<double> p(size_t(s.numel)), g(size_t(s.numel));
  for (int64_t i = 0; i < s.numel; ++i) {
    p[size_t(i)] = ref::to_dtype(s.pdt, np(rng));
    g[size_t(i)] = ref::to_dtype(s.gdt, ng(rng));
    store(s.pdt, param.t.data, i, p[size_t(i)]);
    store(s.gdt, grad.t.data, i, g[size_t(i)]);
  }
  MirroredState m(s.kind, s.numel), v(s.kind, s.numel), vmax(s.kind, s.numel);
  m.randomize(rng, false, 0.01);
  v.randomize(rng, true, 1e-4);
  vmax.randomize(rng, true, 2e-4);

  lbopt_adamw_config cfg;
  lbopt_adamw_config_init(&cfg);
  cfg.state_kind = s.kind;
  cfg.flags = s.flags;
  cfg.weight_decay = 0.05;
  const double lr = 3e-3;
  lbopt_adamw_slot slot{sizeof(lbopt_adamw_slot), &param.t, &grad.t, m.lib.view(), v.lib.view(),
                        ams ? vmax.lib.view() : lbopt_state{nullptr, nullptr}, step};
  REQUIRE_MESSAGE(lbopt_adamw_step(&cfg, lr, &slot, 1, nullptr) == LBOPT_OK, lbopt_last_error());

  ref::Hyper h;
  h.lr = lr;
  h.wd = 0.05;
  h.coupled = s.flags & LBOPT_FLAG_ADAM_COUPLED_DECAY;
  h.amsgrad = ams;
  h.maximize = s.flags & LBOPT_FLAG_MAXIMIZE;
  const ref::Codec cm(s.kind, false), cv(s.kind, true);
  std::vector<double> rm = ref::decode(cm, m.mirror, s.numel), rv = ref::decode(cv, v.mirror, s.numel),
                      rvmax = ams ? ref::decode(cv, vmax.mirror, s.numel) : std::vector<double>(size_t(s.numel));
  ref::Magnitudes mag;
  ref::adamw(h, step, p, g, rm, rv, rvmax, &mag);

  Outcome out;
  for (int64_t i = 0; i < s.numel; ++i) {
    const double want = ref::to_dtype(s.pdt, p[size_t(i)]);
    const double got = ref::load(s.pdt, param.t.data, i);
    if (s.pdt == ref::kF32) {
      out.max_param_rel = std::max(out.max_param_rel, fabs(got - want) / mag.p[size_t(i)]);
    } else if (got != want) {
      // a 16-bit result may round the other way only when the exact value is within float error of a tie
      const double ulp = fabs(ref::to_dtype(s.pdt, want * (1 + 1e-2)) - want);
      CHECK_MESSAGE(fabs(got - want) <= ulp * 1.0001, "element ", i, ": ", got, " vs ", want);
      ++out.param_ulp_flips;
    }
  }
  const auto compare_state = [&](MirroredState& st, const ref::Codec& codec, const std::vector<double>& exact,
                                 const std::vector<double>& size) {
    const ref::QState want = ref::encode(codec, exact);
    if (s.kind == LBOPT_STATE_FP32) {
      for (int64_t i = 0; i < s.numel; ++i)
        out.max_plain_rel = std::max(out.max_plain_rel, fabs(st.lib.codes->as<float>()[i] - exact[size_t(i)]) /
                                                            std::max(size[size_t(i)], 1e-30));
      return;
    }
    for (size_t b = 0; b < want.scales.size(); ++b)
      out.max_scale_rel = std::max(out.max_scale_rel,
                                   fabs(st.lib.scales->as<float>()[b] - want.scales[b]) / want.scales[b]);
    for (int64_t i = 0; i < s.numel; ++i) {
      const int got = get_code(s.kind, *st.lib.codes, i), exp = want.codes[size_t(i)];
      ++out.codes_total;
      if (got != exp) ++(adjacent_codes(s.kind, got, exp) ? out.code_flips : out.far_codes);
    }
  };
  compare_state(m, cm, rm, mag.m);
  compare_state(v, cv, rv, mag.v);
  if (ams) compare_state(vmax, cv, rvmax, mag.v);
  return out;
}

void check_outcome(const Outcome& o, int64_t numel) {
  CHECK(o.far_codes == 0);
  CHECK(double(o.code_flips) <= 0.001 * double(o.codes_total) + 1);  // near-tie flips only
  CHECK(o.max_param_rel <= 1e-6);
  CHECK(double(o.param_ulp_flips) <= 0.001 * double(numel) + 1);
  CHECK(o.max_scale_rel <= 1e-6);
  CHECK(o.max_plain_rel <= 1e-6);
}

}  // namespace

TEST_SUITE("step vs reference") {
  TEST_CASE("one step, every state kind and param/grad dtype pair") {
    int64_t flips = 0, total = 0;
    for (int kind = 0; kind < 4; ++kind)
      for (int pd = 0; pd < 3; ++pd)
        for (int gd = 0; gd < 3; ++gd) {
          const Setup s{lbopt_state_kind(kind), ref::Dtype(pd), ref::Dtype(gd), 4099, 0};
          const std::string kname = kind_name(s.kind);
        CAPTURE(kname);
          CAPTURE(pd);
          CAPTURE(gd);
          const Outcome o = one_step(s, 1000 + uint64_t(kind * 9 + pd * 3 + gd), 7);
          check_outcome(o, s.numel);
          flips += o.code_flips;
          total += o.codes_total;
        }
    MESSAGE("near-tie code flips: ", flips, " of ", total);
  }

  TEST_CASE("one step, flags: Adam coupled decay, AMSGrad, maximize and all together") {
    const uint32_t flag_sets[] = {LBOPT_FLAG_ADAM_COUPLED_DECAY, LBOPT_FLAG_AMSGRAD, LBOPT_FLAG_MAXIMIZE,
                                  LBOPT_FLAG_ADAM_COUPLED_DECAY | LBOPT_FLAG_AMSGRAD | LBOPT_FLAG_MAXIMIZE};
    for (int kind = 0; kind < 4; ++kind)
      for (uint32_t flags : flag_sets) {
        const std::string kname = kind_name(lbopt_state_kind(kind));
        CAPTURE(kname);
        CAPTURE(flags);
        check_outcome(one_step({lbopt_state_kind(kind), ref::kF32, ref::kBF16, 1537, flags}, 77 + flags, 1), 1537);
      }
  }

  TEST_CASE("element counts: single element, odd 4-bit counts, partial last blocks, exact blocks") {
    for (int64_t n : {1, 2, 3, 127, 128, 129, 255, 256, 257, 511, 1025}) {
      for (int kind = 0; kind < 4; ++kind) {
        CAPTURE(n);
        const std::string kname = kind_name(lbopt_state_kind(kind));
        CAPTURE(kname);
        check_outcome(one_step({lbopt_state_kind(kind), ref::kBF16, ref::kF32, n, 0}, uint64_t(n * 4 + kind), 3), n);
      }
    }
  }

  TEST_CASE("4-bit odd count leaves the unused low nibble 0") {
    Buffer p(f32(), {5}), g(f32(), {5});
    for (int i = 0; i < 5; ++i) {
      p.as<float>()[i] = 0.1f * float(i + 1);
      g.as<float>()[i] = 0.01f * float(i - 2);
    }
    State m(LBOPT_STATE_4BIT, 5), v(LBOPT_STATE_4BIT, 5);
    lbopt_adamw_config cfg;
    lbopt_adamw_config_init(&cfg);
    lbopt_adamw_slot slot{sizeof(lbopt_adamw_slot), &p.t, &g.t, m.view(), v.view(), {nullptr, nullptr}, 1};
    REQUIRE(lbopt_adamw_step(&cfg, 1e-3, &slot, 1, nullptr) == LBOPT_OK);
    CHECK((m.codes->as<uint8_t>()[2] & 0x0f) == 0);
    CHECK((v.codes->as<uint8_t>()[2] & 0x0f) == 0);
  }
}
