// CPU step throughput against a memory copy measured in the same run.
// usage: bench_step [numel=16777216] [threads=all] [reps=5]
// Prints, per state kind and param dtype: ns per element, effective GB/s (bytes of ALGORITHMS.md section 8:
// param read+write, grad read, both states read+written) and the ratio to the copy's GB/s.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "lbopt.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <class F>
double best_of(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    f();
    best = std::min(best, now() - t0);
  }
  return best;
}

DLTensor view(void* data, int64_t* shape, DLDataType dt) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

// Copy rate (read + write bytes per second) of `threads` threads each copying its share.
double copy_gbs(size_t bytes, int threads, int reps) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  const double t = best_of(reps, [&] {
    std::vector<std::thread> ts;
    const size_t share = bytes / size_t(threads);
    for (int i = 0; i < threads; ++i)
      ts.emplace_back([&, i] { memcpy(b.data() + i * share, a.data() + i * share, share); });
    for (auto& th : ts) th.join();
  });
  return 2.0 * double(bytes) / t / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : (int64_t(1) << 24);
  const int threads = argc > 2 ? atoi(argv[2]) : 0;
  const int reps = argc > 3 ? atoi(argv[3]) : 5;
  if (lbopt_set_num_threads(threads) != LBOPT_OK) return 1;
  const int used = lbopt_get_num_threads();
  const double copy = copy_gbs(size_t(n) * 4, used, reps);
  printf("numel %lld, threads %d, copy %.2f GB/s\n", (long long)n, used, copy);
  printf("%-6s %-6s %10s %10s %9s\n", "state", "param", "ns/elem", "GB/s", "vs copy");

  const DLDataType f32{kDLFloat, 32, 1}, bf16{kDLBfloat, 16, 1};
  const char* kinds[] = {"4bit", "8bit", "fp8", "fp32"};
  for (int k = 0; k < 4; ++k)
    for (int pd = 0; pd < 2; ++pd) {
      const DLDataType dt = pd ? bf16 : f32;
      const size_t elem = pd ? 2 : 4;
      std::vector<uint8_t> p(size_t(n) * elem, 0), g(size_t(n) * elem, 0);
      for (size_t i = 0; i < size_t(n); ++i) {  // small nonzero values in either dtype's upper bytes
        p[i * elem + elem - 1] = 0x3c;
        g[i * elem + elem - 1] = 0x38;
      }
      lbopt_layout l;
      lbopt_state_layout(lbopt_state_kind(k), n, &l, sizeof l);
      std::vector<uint8_t> mc(size_t(l.codes_bytes)), vc(size_t(l.codes_bytes));
      std::vector<float> ms(size_t(std::max<int64_t>(l.scales_numel, 1))), vs(ms.size());
      int64_t cn = l.codes_numel, sn = l.scales_numel;
      DLTensor tp = view(p.data(), &n, dt), tg = view(g.data(), &n, dt), tmc = view(mc.data(), &cn, l.codes_dtype),
               tvc = view(vc.data(), &cn, l.codes_dtype), tms = view(ms.data(), &sn, f32),
               tvs = view(vs.data(), &sn, f32);
      const bool plain = k == LBOPT_STATE_FP32;
      lbopt_adamw_slot slot{sizeof slot, &tp, &tg, {&tmc, plain ? nullptr : &tms}, {&tvc, plain ? nullptr : &tvs},
                            {nullptr, nullptr}, 1};
      lbopt_adamw_config cfg;
      lbopt_adamw_config_init(&cfg, sizeof cfg);
      cfg.state_kind = lbopt_state_kind(k);
      lbopt_state_init(cfg.state_kind, n, slot.m, nullptr);
      lbopt_state_init(cfg.state_kind, n, slot.v, nullptr);
      int64_t step = 0;
      const double t = best_of(reps, [&] {
        slot.step = ++step;
        if (lbopt_adamw_step(&cfg, 1e-3, &slot, 1, nullptr) != LBOPT_OK) {
          fprintf(stderr, "%s\n", lbopt_last_error());
          exit(1);
        }
      });
      // param r+w, grad r, codes r+w for m and v, scales r+w for m and v
      const double bytes = double(n) * (3.0 * double(elem)) + 4.0 * double(l.codes_bytes) + 16.0 * double(sn);
      const double gbs = bytes / t / 1e9;
      printf("%-6s %-6s %10.3f %10.2f %8.1f%%\n", kinds[k], pd ? "bf16" : "fp32", t / double(n) * 1e9, gbs,
             100.0 * gbs / copy);
    }
  return 0;
}
