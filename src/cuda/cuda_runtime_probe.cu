// Whether this machine can run CUDA work: the library links the CUDA runtime statically, so it loads everywhere;
// without a driver or device the runtime answers with an error, and the CPU path keeps working.
#include <cuda_runtime.h>
#include <stdio.h>

#include "cuda_probe.h"

namespace lbopt {

CudaAvailability cuda_availability() {
  CudaAvailability a;
  const cudaError_t err = cudaGetDeviceCount(&a.devices);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    a.devices = 0;
    a.reason = cudaGetErrorString(err);
  } else if (a.devices == 0) {
    a.reason = "no CUDA device";
  }
  static char text[160];
  if (a.devices == 0) {  // say what is missing in words that name CUDA
    snprintf(text, sizeof text, "CUDA is not available here: %s", a.reason);
    a.reason = text;
  }
  return a;
}

}  // namespace lbopt
