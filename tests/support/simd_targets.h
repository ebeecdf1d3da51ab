// The SIMD-against-portable harness of the CPU suites: results computed with LBOPT_CPU_KERNELS=portable, then
// again on every instruction set this machine supports, each forced in turn through Highway's test hook.
#pragma once
#include <doctest/doctest.h>
#include <hwy/targets.h>
#include <stdlib.h>

#include <string>

#include "lbopt.h"

namespace test {

// f() with the SIMD kernels off.
template <class F>
auto with_portable_kernels(const F& f) {
  setenv("LBOPT_CPU_KERNELS", "portable", 1);
  CHECK(std::string(lbopt_build_info()).find("\"cpu_kernels\":\"portable\"") != std::string::npos);
  auto result = f();
  unsetenv("LBOPT_CPU_KERNELS");
  return result;
}

// f(name) once per supported instruction set among AVX3_DL, AVX3, AVX2, SSE4 and NEON, with the dispatch forced to
// it; checks that at least one ran.
template <class F>
void for_each_simd_target(const F& f) {
  const int64_t supported = hwy::SupportedTargets();
  int tried = 0;
  for (int64_t target :
       {int64_t(HWY_AVX3_DL), int64_t(HWY_AVX3), int64_t(HWY_AVX2), int64_t(HWY_SSE4), int64_t(HWY_NEON)}) {
    if (!(supported & target)) continue;
    hwy::SetSupportedTargetsForTest(target);
    const std::string name = hwy::TargetName(target);
    CAPTURE(name);
    CHECK(std::string(lbopt_build_info()).find("\"cpu_kernels\":\"" + name + "\"") != std::string::npos);
    f(name);
    ++tried;
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the real CPU
  MESSAGE("instruction sets compared with the portable kernels: ", tried);
  CHECK(tried >= 1);
}

}  // namespace test
