// CUDA availability, compiled in only with the CUDA backend (LBOPT_WITH_CUDA).
#pragma once

namespace lbopt {

struct CudaAvailability {
  int devices = 0;
  const char* reason = "";  // why none is usable (static text)
};

#if LBOPT_WITH_CUDA
CudaAvailability cuda_availability();
#else
inline CudaAvailability cuda_availability() { return {0, "this build of lbopt has no CUDA backend"}; }
#endif

}  // namespace lbopt
