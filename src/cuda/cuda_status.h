// CUDA runtime errors as lbopt statuses, and DLPack's stream numbers as CUDA streams: shared by the CUDA side of
// validation (validate_cuda.cu) and the CUDA backend (backend_cuda.cu).
#pragma once
#include <cuda_runtime.h>

#include "../error.h"

namespace lbopt {

inline lbopt_status cuda_fail(cudaError_t e, const char* what) {
  cudaGetLastError();  // clear a non-sticky error so the caller's next CUDA call starts clean
  if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || e == cudaErrorInitializationError)
    return fail(LBOPT_ERR_UNSUPPORTED, "%s: CUDA is not available here: %s", what, cudaGetErrorString(e));
  return fail(LBOPT_ERR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define LBOPT_CUDA_TRY(call, what)                                     \
  do {                                                                 \
    const cudaError_t lbopt_err_ = (call);                             \
    if (lbopt_err_ != cudaSuccess) return cuda_fail(lbopt_err_, what); \
  } while (0)

// DLPack's stream numbers 1 and 2 name the legacy and the per-thread default streams.
inline cudaStream_t to_stream(void* s) {
  if (s == reinterpret_cast<void*>(1)) return cudaStreamLegacy;
  if (s == reinterpret_cast<void*>(2)) return cudaStreamPerThread;
  return static_cast<cudaStream_t>(s);
}

}  // namespace lbopt
