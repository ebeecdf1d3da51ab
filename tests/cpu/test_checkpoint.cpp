// Checkpoints and determinism: states round-trip through quantize/dequantize, a run resumed from saved buffers
// is bit-identical to an uninterrupted one, and results depend on neither the thread count nor the grouping of
// tensors into calls.
#include <doctest/doctest.h>

#include <math.h>

#include <random>

#include "harness.h"

using namespace test;

namespace {

struct Run {
  lbopt_state_kind kind;
  uint32_t flags;
  Buffer p, g;
  State m, v, vmax;
  Run(lbopt_state_kind k, uint32_t f, int64_t n)
      : kind(k), flags(f), p(bf16(), {n}), g(f32(), {n}), m(k, n), v(k, n), vmax(k, n) {
    std::mt19937_64 rng(9);
    std::normal_distribution<double> nd;
    for (int64_t i = 0; i < n; ++i) store(ref::kBF16, p.t.data, i, ref::to_dtype(ref::kBF16, 0.1 * nd(rng)));
    lbopt_state_init(k, n, m.view(), nullptr);
    lbopt_state_init(k, n, v.view(), nullptr);
    lbopt_state_init(k, n, vmax.view(), nullptr);
  }
  lbopt_adamw_slot slot(int64_t step) {
    const bool ams = flags & LBOPT_FLAG_AMSGRAD;
    return {sizeof(lbopt_adamw_slot), &p.t, &g.t, m.view(), v.view(), ams ? vmax.view() : lbopt_state{}, step};
  }
  // Deterministic gradients: a function of the param and the step.
  void make_grad(int64_t step) {
    for (int64_t i = 0; i < g.numel(); ++i)
      g.as<float>()[i] = float(bf16_value(p, i) * 0.5 + 0.01 * sin(double(step * 131 + i)));
  }
  void steps(int64_t from, int64_t to) {
    lbopt_adamw_config cfg;
    lbopt_adamw_config_init(&cfg, sizeof cfg);
    cfg.state_kind = kind;
    cfg.flags = flags;
    cfg.seed = 1234;
    for (int64_t s = from; s <= to; ++s) {
      make_grad(s);
      const lbopt_adamw_slot sl = slot(s);
      REQUIRE(lbopt_adamw_step(&cfg, 1e-3 * (1.0 + cos(double(s))), &sl, 1, nullptr) == LBOPT_OK);
    }
  }
  uint64_t digest() const {
    return hash(p) ^ 3 * hash(*m.codes) ^ 5 * hash(*v.codes) ^ 7 * hash(*vmax.codes) ^
           (m.scales ? 11 * hash(*m.scales) ^ 13 * hash(*v.scales) : 0);
  }
};

void copy(Buffer& dst, const Buffer& src) { memcpy(dst.as<uint8_t>(), src.as<uint8_t>(), src.bytes()); }

}  // namespace

TEST_SUITE("checkpoint and determinism") {
  TEST_CASE("saving codes + scales mid-run and resuming is bit-identical to an uninterrupted run") {
    const uint32_t flag_sets[] = {0, LBOPT_FLAG_AMSGRAD | LBOPT_FLAG_BF16_STOCHASTIC_ROUND};
    for (int kind = 0; kind < 4; ++kind)
      for (uint32_t flags : flag_sets) {
        CAPTURE(kind);
        CAPTURE(flags);
        const int64_t n = 3001;
        Run whole(lbopt_state_kind(kind), flags, n), first(lbopt_state_kind(kind), flags, n),
            resumed(lbopt_state_kind(kind), flags, n);
        whole.steps(1, 40);
        first.steps(1, 20);
        // "checkpoint": copy the plain buffers into a fresh run, as a framework's state_dict would
        copy(resumed.p, first.p);
        for (auto [dst, src] : {std::pair<State*, State*>{&resumed.m, &first.m}, {&resumed.v, &first.v},
                                {&resumed.vmax, &first.vmax}}) {
          copy(*dst->codes, *src->codes);
          if (src->scales) copy(*dst->scales, *src->scales);
        }
        resumed.steps(21, 40);
        CHECK(resumed.digest() == whole.digest());
        CHECK(resumed.digest() != first.digest());  // the digest sees the steps
      }
  }

  TEST_CASE("representable states round-trip exactly through quantize and dequantize") {
    // Values built from codes, with each block holding the map's top value (1.0, or 448 for e4m3) so that its
    // absmax reproduces the scale: quantize must find the same codes, dequantize the same values. (Arbitrary
    // values are not a fixed point: the signed maps have no -1, so a negative absmax re-scales the block.)
    std::mt19937_64 rng(17);
    std::uniform_real_distribution<double> us(1e-6, 1e-1);
    for (int kind = 0; kind < 4; ++kind)
      for (int moment = 0; moment < 3; ++moment) {
        CAPTURE(kind);
        CAPTURE(moment);
        const auto k = lbopt_state_kind(kind);
        const auto mo = lbopt_moment(moment);
        const int64_t n = 1001, bs = kind == LBOPT_STATE_4BIT ? 128 : 256;
        const ref::Codec codec(kind == LBOPT_STATE_FP32 ? ref::kFp8 : kind, moment);
        Buffer x(f32(), {n}), y(f32(), {n});
        std::vector<int> codes(static_cast<size_t>(n));
        std::uniform_int_distribution<int> uc(0, int(codec.values.size()) - 1);
        double scale = 0;
        for (int64_t i = 0; i < n; ++i) {
          if (i % bs == 0) scale = us(rng);
          int c = uc(rng);
          if (codec.kind == ref::kFp8) c = moment ? c & 0x7e : ((c & 0x7f) == 0x7f ? c - 1 : c);
          if (kind == LBOPT_STATE_4BIT && moment == LBOPT_MOMENT_SECOND_SIGNED) c = 7 + c % 9;  // values >= 0
          if (i % bs == 0) c = codec.kind == ref::kFp8 ? 0x7e : int(codec.values.size()) - 1;  // the top value
          codes[size_t(i)] = c;
          x.as<float>()[i] = float(codec.values[size_t(c)] * (codec.kind == ref::kFp8 ? scale / 448 : scale));
        }
        State st(k, n);
        REQUIRE(lbopt_quantize(k, mo, &x.t, st.view(), nullptr) == LBOPT_OK);
        REQUIRE(lbopt_dequantize(k, mo, st.view(), &y.t, nullptr) == LBOPT_OK);
        int64_t code_diffs = 0;
        double max_rel = 0;
        for (int64_t i = 0; i < n; ++i) {
          if (kind != LBOPT_STATE_FP32) {
            const int got = get_code(k, *st.codes, i), want = codes[size_t(i)];
            code_diffs += got != want && !(kind == LBOPT_STATE_FP8 && (got & 0x7f) == 0 && (want & 0x7f) == 0);
          }
          const double xi = x.as<float>()[i];
          if (xi != 0) max_rel = std::max(max_rel, fabs(y.as<float>()[i] - xi) / fabs(xi));
        }
        CHECK(code_diffs == 0);
        // float rounding only: the reference's 8-bit values are the rule's (within 2 ulps of the tables), the
        // e4m3 scale absmax/448 may round by an ulp
        CHECK(max_rel <= 3e-7);
      }
  }

  TEST_CASE("results do not depend on the thread count or on how tensors are grouped into calls") {
    const int64_t sizes[] = {1, 300, 70000, 200001};
    std::vector<uint64_t> digests;
    for (int threads : {1, 2, 3}) {
      REQUIRE(lbopt_set_num_threads(threads) == LBOPT_OK);
      CHECK(lbopt_get_num_threads() == threads);
      for (bool one_call : {true, false}) {
        std::vector<std::unique_ptr<Run>> runs;
        for (int64_t n : sizes) runs.push_back(std::make_unique<Run>(LBOPT_STATE_4BIT, LBOPT_FLAG_BF16_STOCHASTIC_ROUND, n));
        lbopt_adamw_config cfg;
        lbopt_adamw_config_init(&cfg, sizeof cfg);
        cfg.flags = LBOPT_FLAG_BF16_STOCHASTIC_ROUND;
        for (int64_t s = 1; s <= 3; ++s) {
          std::vector<lbopt_adamw_slot> slots;
          for (auto& r : runs) {
            r->make_grad(s);
            slots.push_back(r->slot(s));
          }
          if (one_call) {
            REQUIRE(lbopt_adamw_step(&cfg, 1e-3, slots.data(), slots.size(), nullptr) == LBOPT_OK);
          } else {
            for (const auto& sl : slots) REQUIRE(lbopt_adamw_step(&cfg, 1e-3, &sl, 1, nullptr) == LBOPT_OK);
          }
        }
        uint64_t d = 0;
        for (auto& r : runs) d = d * 31 + r->digest();
        digests.push_back(d);
      }
    }
    REQUIRE(lbopt_set_num_threads(0) == LBOPT_OK);
    for (uint64_t d : digests) CHECK(d == digests[0]);
  }

  TEST_CASE("bf16 stochastic rounding: unbiased, reproducible for a seed, different across seeds") {
    // A param halfway between two bf16 values and a zero update: round-to-nearest always lands on one side,
    // stochastic rounding on each side about half the time.
    const int64_t n = 1 << 16;
    auto run = [&](uint64_t seed, uint32_t flags) {
      Buffer p(bf16(), {n}), g(f32(), {n});
      State m(LBOPT_STATE_FP32, n), v(LBOPT_STATE_FP32, n);
      lbopt_state_init(LBOPT_STATE_FP32, n, m.view(), nullptr);
      lbopt_state_init(LBOPT_STATE_FP32, n, v.view(), nullptr);
      for (int64_t i = 0; i < n; ++i) p.as<uint16_t>()[i] = 0x3f80;  // 1.0
      lbopt_adamw_config cfg;
      lbopt_adamw_config_init(&cfg, sizeof cfg);
      cfg.state_kind = LBOPT_STATE_FP32;
      cfg.flags = flags;
      cfg.seed = seed;
      cfg.weight_decay = 0.0;
      // lr chosen so that p - lr * m / (sqrt(v) + eps) = 1 - 2^-9 * 0.25 exactly enough: a quarter of an ulp down
      for (int64_t i = 0; i < n; ++i) g.as<float>()[i] = 1.0f;
      const lbopt_adamw_slot sl{sizeof(lbopt_adamw_slot), &p.t, &g.t, m.view(), v.view(), {}, 1};
      REQUIRE(lbopt_adamw_step(&cfg, 0.25 * 0.00390625 * (1.0 - 1e-7), &sl, 1, nullptr) == LBOPT_OK);
      std::vector<uint16_t> out(p.as<uint16_t>(), p.as<uint16_t>() + n);
      return out;
    };
    const auto nearest = run(1, 0), a = run(1, LBOPT_FLAG_BF16_STOCHASTIC_ROUND),
               b = run(1, LBOPT_FLAG_BF16_STOCHASTIC_ROUND), c = run(2, LBOPT_FLAG_BF16_STOCHASTIC_ROUND);
    for (uint16_t x : nearest) REQUIRE(x == 0x3f80);  // a quarter ulp below 1.0 rounds back to 1.0
    int64_t down = 0;
    for (uint16_t x : a) {
      REQUIRE((x == 0x3f80 || x == 0x3f7f));
      down += x == 0x3f7f;
    }
    // 1 - 2^-10 lies a quarter of the way from 1.0 (0x3f80) down to 1 - 2^-8 (0x3f7f)... within 1% of 0.25
    CHECK(fabs(double(down) / double(n) - 0.25) < 0.01);
    CHECK(a == b);
    CHECK(a != c);
  }
}
