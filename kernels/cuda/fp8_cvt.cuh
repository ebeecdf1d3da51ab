// The e4m3 encode by the conversion instruction of sm_89 and later (cvt.rn.satfinite.e4m3x2.f32, through
// cuda_fp8.h): round to nearest even, finite values past 448 saturated to it, as fp8_e4m3_encode (state_kinds.h)
// does in software. tests/gpu/test_gpu.cu compares the two on every finite float on the device; older
// architectures take the software encode.
#pragma once
#include <cuda_fp8.h>
#include <stdint.h>

#include "../state_kinds.h"

namespace lbopt::cuda {

__device__ __forceinline__ uint8_t fp8_e4m3_encode_cvt(float x) {
#if __CUDA_ARCH__ >= 890
  return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
#else
  return fp8_e4m3_encode(x);
#endif
}

}  // namespace lbopt::cuda
