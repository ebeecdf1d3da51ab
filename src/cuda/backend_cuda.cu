// The CUDA backend: launches a plan that validation (../validate.cpp, validate_cuda.cu) accepted on the caller's
// stream. The library never synchronizes: AMP scalars, the non-finite scan and the
// capturable lr and step are read by the kernels themselves.
#include <cuda_runtime.h>

#include "../../kernels/cuda/step_kernels.cuh"
#include "../../kernels/quant.h"
#include "../backend.h"
#include "cuda_probe.h"
#include "cuda_status.h"
#include "validate_cuda.h"

namespace lbopt {
namespace {

// Makes the call's device current and restores the caller's on exit.
class DeviceScope {
 public:
  lbopt_status enter(int device) {
    LBOPT_CUDA_TRY(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) LBOPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    return LBOPT_OK;
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

lbopt_status cuda_step(const StepPlan& plan) {
  DeviceScope scope;
  LBOPT_TRY(scope.enter(plan.device.id));
  const cudaStream_t stream = to_stream(plan.stream);  // stream and pointers checked by validation

  const size_t n = plan.slots.size();
  // Per-slot skip flags: the caller's options.skipped, or stream-ordered scratch (pooled, no synchronization).
  uint8_t* skip = plan.skipped;
  if (!skip) LBOPT_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&skip), n, stream), "cudaMallocAsync");
  LBOPT_CUDA_TRY(cudaMemsetAsync(skip, 0, n, stream), "cudaMemsetAsync");

  thread_local cuda::StepLaunch a;  // 20 KB: not on the stack
  const int64_t block = work_block_size(plan.kind);
  lbopt_status status = LBOPT_OK;
  for (size_t first = 0; first < n && status == LBOPT_OK; first += cuda::kMaxSlotsPerLaunch) {
    const int count = int(n - first < size_t(cuda::kMaxSlotsPerLaunch) ? n - first : cuda::kMaxSlotsPerLaunch);
    a.n_slots = count;
    a.kind = plan.kind;
    a.stochastic_round = plan.flags & LBOPT_FLAG_BF16_STOCHASTIC_ROUND;
    a.state_stochastic_round = plan.stochastic_states;
    a.seed = plan.seed;
    a.lr_scalar = plan.lr_scalar;
    a.step_scalar = plan.step_scalar;
    a.lr_is_double = plan.lr_is_double;
    a.step_is_int64 = plan.step_is_int64;
    a.hyper = plan.hyper;
    a.grad_scale = plan.grad_scale;
    a.found_inf = plan.found_inf;
    a.skip = skip + first;
    int64_t blocks = 0;
    for (int i = 0; i < count; ++i) {
      const StepSlot& s = plan.slots[first + size_t(i)];  // scalars derived by validation (by-value lr)
      a.slots[i] = s;
      a.first_block[i] = blocks;
      blocks += (s.numel + block - 1) / block;
    }
    a.first_block[count] = blocks;
    a.total_blocks = blocks;
    if (blocks == 0) continue;
    cudaError_t e = cudaSuccess;
    if (plan.flags & LBOPT_FLAG_SKIP_NONFINITE) e = cuda::launch_nonfinite_scan(a, stream);
    if (e == cudaSuccess) e = cuda::launch_step(a, stream);
    if (e != cudaSuccess) status = cuda_fail(e, "step kernel launch");
  }
  if (!plan.skipped) {
    const cudaError_t e = cudaFreeAsync(skip, stream);
    if (e != cudaSuccess && status == LBOPT_OK) status = cuda_fail(e, "cudaFreeAsync");
  }
  return status;
}

lbopt_status cuda_convert(const ConvertPlan& plan, bool to_state) {
  DeviceScope scope;
  LBOPT_TRY(scope.enter(plan.device.id));
  const cudaStream_t stream = to_stream(plan.stream);
  const cuda::ConvertLaunch a{plan.kind, plan.moment, to_state, plan.numel, plan.values, plan.state};
  const cudaError_t e = cuda::launch_convert(a, stream);
  return e == cudaSuccess ? LBOPT_OK : cuda_fail(e, "conversion kernel launch");
}

// On the device, quantize cannot refuse NaN/Inf without synchronizing: it stores them as 0 (as the step does).
lbopt_status cuda_quantize(const ConvertPlan& plan) { return cuda_convert(plan, true); }
lbopt_status cuda_dequantize(const ConvertPlan& plan) { return cuda_convert(plan, false); }

lbopt_status cuda_state_init(const ConvertPlan& plan) {
  DeviceScope scope;
  LBOPT_TRY(scope.enter(plan.device.id));
  const cudaStream_t stream = to_stream(plan.stream);
  const lbopt_layout layout = layout_of(plan.kind, plan.numel);
  if (layout.codes_bytes)
    LBOPT_CUDA_TRY(cudaMemsetAsync(plan.state.codes, 0, size_t(layout.codes_bytes), stream), "cudaMemsetAsync");
  if (layout.scales_numel)
    LBOPT_CUDA_TRY(cudaMemsetAsync(plan.state.scales, 0, size_t(layout.scales_numel) * sizeof(float), stream),
                   "cudaMemsetAsync");
  return LBOPT_OK;
}

DeviceCount cuda_devices() {
  static const CudaAvailability a = cuda_availability();
  return {a.devices, a.reason};
}

}  // namespace

const Backend& cuda_backend() {
  static const Backend b{"cuda",    DeviceClass::kCuda, cuda_devices,    validate_cuda_step, validate_cuda_convert,
                         cuda_step, cuda_quantize,      cuda_dequantize, cuda_state_init};
  return b;
}

}  // namespace lbopt
