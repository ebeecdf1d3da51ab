// Many threads calling the library at once (sharing its thread pool) give bit-identical results to the same calls
// made one after another, and each thread keeps its own lbopt_last_error().
#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

#include "harness.h"

using namespace test;

namespace {

struct Set : StepTensors {
  using StepTensors::StepTensors;
  void train(int steps) {
    lbopt_adamw_config cfg;
    lbopt_adamw_config_init(&cfg, sizeof cfg);
    cfg.state_kind = kind;
    cfg.flags = LBOPT_FLAG_BF16_STOCHASTIC_ROUND;
    for (int s = 1; s <= steps; ++s) {
      const lbopt_adamw_slot sl = slot(s);
      REQUIRE(lbopt_adamw_step(&cfg, 1e-3 * (1 + s % 3), &sl, 1, nullptr) == LBOPT_OK);
    }
  }
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
