// GPU step throughput of every optimizer and state kind, against a device-to-device copy of the same bytes
// measured in the same run, and each optimizer's time against AdamW's at the same kind, dtype and size.
// Params and grads are random (the grads fixed), the states start at zero.
// usage: bench_gpu [max_numel=1e9] [min_numel=1e6] [reps=10]; prints a markdown table (bytes as docs/formats.md,
// "Bytes a step moves", counts them: param read and written, grad read, each state's codes and scales read and
// written).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <map>
#include <tuple>

#include <thrust/device_vector.h>

#include "lbopt.h"

namespace {

template <class F>
float time_ms(int reps, const F& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  f();  // warm-up
  cudaEventRecord(a, nullptr);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b, nullptr);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / float(reps);
}

// Normal-ish values of the given scale (a sum of four uniforms from a hash of the index): steps on zeros would
// take the division's slow path everywhere, which real training does not.
__global__ void fill_random(void* out, int64_t n, bool bf16, float scale, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t h = (uint64_t(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    float sum = 0.0f;
    for (int k = 0; k < 4; ++k) {
      h ^= h >> 31;
      h *= 0xBF58476D1CE4E5B9ull;
      sum += float(h >> 40) * (1.0f / 16777216.0f) - 0.5f;
    }
    const float x = sum * 1.7320508f * scale;
    if (bf16) static_cast<uint16_t*>(out)[i] = uint16_t(__float_as_uint(x) >> 16);
    else static_cast<float*>(out)[i] = x;
  }
}

DLTensor view(void* p, int64_t* shape, uint8_t code, uint8_t bits) {
  return DLTensor{p, {kDLCUDA, 0}, 1, {code, bits, 1}, shape, nullptr, 0};
}

const char* kind_name(int kind) {
  static const char* const names[] = {"4-bit", "8-bit", "fp8", "fp32"};
  return names[kind];
}

}  // namespace

int main(int argc, char** argv) {
  const double max_n = argc > 1 ? atof(argv[1]) : 1e9;
  const double min_n = argc > 2 ? atof(argv[2]) : 1e6;
  const int reps = argc > 3 ? atoi(argv[3]) : 10;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("%s, lbopt %s\n\n| optimizer | state | param | numel | step ms | GB/s | copy GB/s | vs copy | vs AdamW |\n"
         "|---|---|---|---|---|---|---|---|---|\n",
         prop.name, lbopt_version_string());
  std::map<std::tuple<double, int, int>, float> adamw_ms;  // (numel, kind, bf16) -> AdamW's step time
  for (double nd = min_n; nd <= max_n * 1.0001; nd *= 10)
    for (int opt = 0; opt < 4; ++opt)
      for (int kind = 0; kind < 4; ++kind)
        for (int bf16 : {0, 1}) {
          int64_t n = int64_t(nd);
          lbopt_optimizer_config cfg;
          lbopt_optimizer_config_init(&cfg, sizeof cfg, lbopt_optimizer(opt));
          cfg.state_kind = lbopt_state_kind(kind);
          lbopt_state_info info[LBOPT_MAX_STATES];
          size_t n_states = 0;
          lbopt_optimizer_states(&cfg, info, &n_states);
          lbopt_layout l;
          lbopt_state_layout(lbopt_state_kind(kind), n, &l, sizeof l);
          const size_t pb = size_t(n) * (bf16 ? 2 : 4);
          thrust::device_vector<uint8_t> p(pb), g(pb);
          fill_random<<<1024, 256>>>(thrust::raw_pointer_cast(p.data()), n, bf16, 0.1f, 1);
          fill_random<<<1024, 256>>>(thrust::raw_pointer_cast(g.data()), n, bf16, 0.01f, 2);
          thrust::device_vector<uint8_t> codes[LBOPT_MAX_STATES];
          thrust::device_vector<float> scales[LBOPT_MAX_STATES];
          DLTensor tc[LBOPT_MAX_STATES], ts[LBOPT_MAX_STATES];
          int64_t cn = l.codes_numel, sn = l.scales_numel;
          DLTensor tp = view(thrust::raw_pointer_cast(p.data()), &n, bf16 ? kDLBfloat : kDLFloat, bf16 ? 16 : 32);
          DLTensor tg = tp;
          tg.data = thrust::raw_pointer_cast(g.data());
          lbopt_slot slot{sizeof slot, &tp, &tg, {}, 1};
          for (size_t k = 0; k < n_states; ++k) {
            codes[k].assign(size_t(l.codes_bytes), 0);
            scales[k].assign(size_t(sn) + 1, 0.0f);
            tc[k] = view(thrust::raw_pointer_cast(codes[k].data()), &cn, l.codes_dtype.code, l.codes_dtype.bits);
            ts[k] = view(thrust::raw_pointer_cast(scales[k].data()), &sn, kDLFloat, 32);
            slot.states[k] = {&tc[k], kind == LBOPT_STATE_FP32 ? nullptr : &ts[k]};
          }
          int64_t step = 0;
          const float ms_step = time_ms(reps, [&] {
            slot.step = ++step;
            if (lbopt_step(&cfg, 1e-3 / double(step), &slot, 1, nullptr) != LBOPT_OK) {
              fprintf(stderr, "%s\n", lbopt_last_error());
              exit(1);
            }
          });
          if (cudaDeviceSynchronize() != cudaSuccess) {
            fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
            return 1;
          }
          const double bytes = 3.0 * double(pb) + double(n_states) * (2.0 * double(l.codes_bytes) + 8.0 * double(sn));
          thrust::device_vector<uint8_t> src(size_t(bytes / 2)), dst(size_t(bytes / 2));
          const float ms_copy = time_ms(reps, [&] {
            cudaMemcpyAsync(thrust::raw_pointer_cast(dst.data()), thrust::raw_pointer_cast(src.data()), src.size(),
                            cudaMemcpyDeviceToDevice, nullptr);
          });
          if (opt == LBOPT_OPTIMIZER_ADAMW) adamw_ms[{nd, kind, bf16}] = ms_step;
          const double gbs = bytes / ms_step / 1e6, copy = bytes / ms_copy / 1e6;
          printf("| %s | %s | %s | %.0e | %.3f | %.0f | %.0f | %.0f%% | %.2fx |\n",
                 lbopt_optimizer_name(lbopt_optimizer(opt)), kind_name(kind), bf16 ? "bf16" : "fp32", double(n),
                 ms_step, gbs, copy, 100.0 * gbs / copy, ms_step / adamw_ms[{nd, kind, bf16}]);
          fflush(stdout);
        }
  return 0;
}
