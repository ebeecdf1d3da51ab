// Version and build description.
#include <stdio.h>

#include "../kernels/cpu/kernels_cpu.h"
#include "cuda/cuda_probe.h"
#include "lbopt.h"
#include "thread_pool.h"

#define LBOPT_STR2(x) #x
#define LBOPT_STR(x) LBOPT_STR2(x)

extern "C" uint32_t lbopt_version(void) { return LBOPT_VERSION; }

extern "C" const char* lbopt_version_string(void) {
  return LBOPT_STR(LBOPT_VERSION_MAJOR) "." LBOPT_STR(LBOPT_VERSION_MINOR) "." LBOPT_STR(LBOPT_VERSION_PATCH);
}

extern "C" const char* lbopt_build_info(void) {
  thread_local char info[512];
  static const lbopt::CudaAvailability cuda = lbopt::cuda_availability();  // starts the CUDA runtime once
  snprintf(info, sizeof info,
           "{\"version\":\"%s\",\"abi\":%d,\"cpu_kernels\":\"%s\",\"threads\":%d,"
           "\"cuda_compiled\":%s,\"cuda_archs\":\"%s\",\"cuda_devices\":%d,\"cuda_runtime\":\"%s\"}",
           lbopt_version_string(), LBOPT_VERSION_MAJOR, lbopt::cpu::simd_target(), lbopt::num_threads(), LBOPT_WITH_CUDA ? "true" : "false",
           LBOPT_CUDA_ARCHS, cuda.devices, cuda.devices > 0 ? "ok" : cuda.reason);
  return info;
}
