// GPU step throughput against a device-to-device copy measured in the same run.
// usage: bench_gpu [max_numel=1e9]; prints a markdown table (bytes as in ALGORITHMS.md section 8).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <thrust/device_vector.h>

#include "lbopt.h"

namespace {

template <class F>
float time_ms(cudaStream_t s, int reps, const F& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  f();  // warm-up
  cudaEventRecord(a, s);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / float(reps);
}

DLTensor view(void* p, int64_t* shape, uint8_t code, uint8_t bits) {
  return DLTensor{p, {kDLCUDA, 0}, 1, {code, bits, 1}, shape, nullptr, 0};
}

}  // namespace

int main(int argc, char** argv) {
  const double max_n = argc > 1 ? atof(argv[1]) : 1e9;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("%s, lbopt %s\n\n| state | param | numel | step ms | GB/s | copy GB/s | vs copy |\n|---|---|---|---|---|---|---|\n",
         prop.name, lbopt_version_string());
  for (double nd = 1e6; nd <= max_n * 1.0001; nd *= 10) {
    int64_t n = int64_t(nd);
    // copy roofline: read + write of the step's byte count
    for (int kind : {0, 1, 3})
      for (int bf16 : {0, 1}) {
        lbopt_layout l;
        lbopt_state_layout(lbopt_state_kind(kind), n, &l, sizeof l);
        const size_t pb = size_t(n) * (bf16 ? 2 : 4);
        thrust::device_vector<uint8_t> p(pb, 0), g(pb, 0), mc(size_t(l.codes_bytes), 0), vc(size_t(l.codes_bytes), 0);
        thrust::device_vector<float> ms(size_t(l.scales_numel) + 1, 0.f), vs(size_t(l.scales_numel) + 1, 0.f);
        int64_t cn = l.codes_numel, sn = l.scales_numel;
        DLTensor tp = view(thrust::raw_pointer_cast(p.data()), &n, bf16 ? kDLBfloat : kDLFloat, bf16 ? 16 : 32);
        DLTensor tg = tp;
        tg.data = thrust::raw_pointer_cast(g.data());
        DLTensor tmc = view(thrust::raw_pointer_cast(mc.data()), &cn, l.codes_dtype.code, l.codes_dtype.bits);
        DLTensor tvc = tmc;
        tvc.data = thrust::raw_pointer_cast(vc.data());
        DLTensor tms = view(thrust::raw_pointer_cast(ms.data()), &sn, kDLFloat, 32), tvs = tms;
        tvs.data = thrust::raw_pointer_cast(vs.data());
        const bool plain = kind == LBOPT_STATE_FP32;
        lbopt_adamw_slot slot{sizeof slot, &tp, &tg, {&tmc, plain ? nullptr : &tms}, {&tvc, plain ? nullptr : &tvs}, {}, 1};
        lbopt_adamw_config cfg;
        lbopt_adamw_config_init(&cfg, sizeof cfg);
        cfg.state_kind = lbopt_state_kind(kind);
        int64_t step = 0;
        const float ms_step = time_ms(nullptr, 10, [&] {
          slot.step = ++step;
          if (lbopt_adamw_step(&cfg, 1e-3, &slot, 1, nullptr) != LBOPT_OK) {
            fprintf(stderr, "%s\n", lbopt_last_error());
            exit(1);
          }
        });
        const double bytes = 3.0 * double(pb) + 4.0 * double(l.codes_bytes) + 16.0 * double(sn);
        thrust::device_vector<uint8_t> src(size_t(bytes / 2)), dst(size_t(bytes / 2));
        const float ms_copy = time_ms(nullptr, 10, [&] {
          cudaMemcpyAsync(thrust::raw_pointer_cast(dst.data()), thrust::raw_pointer_cast(src.data()), src.size(),
                          cudaMemcpyDeviceToDevice, nullptr);
        });
        const double gbs = bytes / ms_step / 1e6, copy = bytes / ms_copy / 1e6;
        printf("| %s | %s | %.0e | %.3f | %.0f | %.0f | %.0f%% |\n", kind == 0 ? "4-bit" : kind == 1 ? "8-bit" : "fp32",
               bf16 ? "bf16" : "fp32", double(n), ms_step, gbs, copy, 100.0 * gbs / copy);
      }
  }
  return 0;
}
