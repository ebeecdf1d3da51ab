// Many threads calling the library at once (sharing its thread pool) give bit-identical results to the same calls
// made one after another, and each thread keeps its own lbopt_last_error().
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

using namespace test;

namespace {

struct Set {
  lbopt_state_kind kind;
  Buffer p, g;
  State m, v;
  Set(lbopt_state_kind k, int64_t n, uint64_t seed) : kind(k), p(bf16(), {n}), g(f32(), {n}), m(k, n), v(k, n) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd;
    for (int64_t i = 0; i < n; ++i) {
      store(ref::kBF16, p.t.data, i, ref::to_dtype(ref::kBF16, nd(rng)));
      g.as<float>()[i] = float(0.01 * nd(rng));
    }
    lbopt_state_init(k, n, m.view(), nullptr);
    lbopt_state_init(k, n, v.view(), nullptr);
  }
  void train(int steps) {
    lbopt_adamw_config cfg;
    lbopt_adamw_config_init(&cfg, sizeof cfg);
    cfg.state_kind = kind;
    cfg.flags = LBOPT_FLAG_BF16_STOCHASTIC_ROUND;
    for (int s = 1; s <= steps; ++s) {
      const lbopt_adamw_slot slot{sizeof slot, &p.t, &g.t, m.view(), v.view(), {}, s};
      REQUIRE(lbopt_adamw_step(&cfg, 1e-3 * (1 + s % 3), &slot, 1, nullptr) == LBOPT_OK);
    }
  }
  uint64_t digest() const { return hash(p) ^ 3 * hash(*m.codes) ^ 5 * hash(*v.codes); }
};

std::vector<std::unique_ptr<Set>> make_sets() {
  std::vector<std::unique_ptr<Set>> sets;
  for (int i = 0; i < 8; ++i)
    sets.push_back(std::make_unique<Set>(lbopt_state_kind(i % 4), 20000 + 70001 * i, uint64_t(i)));
  return sets;
}

}  // namespace

TEST_SUITE("concurrency") {
  TEST_CASE("8 threads stepping distinct tensors equal serial execution bit for bit") {
    auto serial = make_sets(), parallel = make_sets();
    for (auto& s : serial) s->train(20);
    std::vector<std::thread> threads;
    for (auto& s : parallel) threads.emplace_back([&s] { s->train(20); });
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < serial.size(); ++i) {
      CAPTURE(i);
      CHECK(serial[i]->digest() == parallel[i]->digest());
    }
  }

  TEST_CASE("lbopt_last_error is per thread") {
    std::vector<std::thread> threads;
    std::vector<int> ok(8, 0);
    for (int i = 0; i < 8; ++i)
      threads.emplace_back([i, &ok] {
        lbopt_adamw_config cfg;
        lbopt_adamw_config_init(&cfg, sizeof cfg);
        cfg.beta1 = 1.0 + i;  // a distinct failure per thread
        bool all = true;
        for (int k = 0; k < 200; ++k) {
          const lbopt_status st = lbopt_adamw_step(&cfg, 1e-3, nullptr, 0, nullptr);
          const std::string want = "config.beta1 = " + std::to_string(1 + i);
          all = all && st == LBOPT_ERR_INVALID_VALUE && std::string(lbopt_last_error()).rfind(want, 0) == 0;
        }
        ok[size_t(i)] = all;
      });
    for (auto& t : threads) t.join();
    for (int i = 0; i < 8; ++i) CHECK(ok[size_t(i)] == 1);
  }
}
