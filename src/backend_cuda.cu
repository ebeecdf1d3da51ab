// The CUDA backend: checks that every pointer really is device memory of the call's device, then launches the
// step on the caller's stream. The library never synchronizes: AMP scalars, the non-finite scan and the
// capturable lr and step are read by the kernels themselves.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "../kernels/cuda/step_kernels.cuh"
#include "../kernels/quant.h"
#include "backend.h"
#include "error.h"

namespace lbopt {
namespace {

lbopt_status cuda_fail(cudaError_t e, const char* what) {
  cudaGetLastError();  // clear a non-sticky error so the caller's next CUDA call starts clean
  if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || e == cudaErrorInitializationError)
    return fail(LBOPT_ERR_UNSUPPORTED, "%s: CUDA is not available here: %s", what, cudaGetErrorString(e));
  return fail(LBOPT_ERR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define LBOPT_CUDA_TRY(call, what)                         \
  do {                                                     \
    const cudaError_t lbopt_err_ = (call);                 \
    if (lbopt_err_ != cudaSuccess) return cuda_fail(lbopt_err_, what); \
  } while (0)

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

// While a stream of this thread captures a graph in global or thread-local mode, CUDA refuses the calls it deems
// unsafe and invalidates the capture. The checks only query, so they run with this thread in relaxed mode.
class RelaxedCapture {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// DLPack's stream numbers 1 and 2 name the legacy and the per-thread default streams.
cudaStream_t to_stream(void* s) {
  if (s == reinterpret_cast<void*>(1)) return cudaStreamLegacy;
  if (s == reinterpret_cast<void*>(2)) return cudaStreamPerThread;
  return static_cast<cudaStream_t>(s);
}

lbopt_status check_stream(cudaStream_t s, int device) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return LBOPT_OK;
  // A capturing stream refuses cudaStreamGetDevice; a launch into another device's stream fails by itself
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LBOPT_CUDA_TRY(cudaStreamIsCapturing(s, &capture), "options.stream");
  if (capture != cudaStreamCaptureStatusNone) return LBOPT_OK;
  int owner = -1;
  LBOPT_CUDA_TRY(cudaStreamGetDevice(s, &owner), "options.stream");
  if (owner != device)
    return fail(LBOPT_ERR_DEVICE, "options.stream: belongs to cuda:%d but the tensors are on cuda:%d", owner, device);
  return LBOPT_OK;
}

// A tensor claimed to be on cuda:device must point into device (or managed) memory of that device.
lbopt_status check_pointer(const void* p, int device, const char* what, long long slot = -1) {
  if (!p) return LBOPT_OK;  // empty tensor or absent state
  char name[64];
  if (slot >= 0) snprintf(name, sizeof name, "slots[%lld].%s", slot, what);
  else snprintf(name, sizeof name, "%s", what);
  cudaPointerAttributes attr;
  LBOPT_CUDA_TRY(cudaPointerGetAttributes(&attr, p), name);
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    return fail(LBOPT_ERR_DEVICE, "%s: claims cuda:%d but points to host memory", name, device);
  if (attr.device != device)
    return fail(LBOPT_ERR_DEVICE, "%s: claims cuda:%d but the memory is on cuda:%d", name, device, attr.device);
  return LBOPT_OK;
}

// The stream's and the pointers' checks of a call (check_pointers: a callable returning a status), with the thread
// in relaxed capture mode.
template <class F>
lbopt_status check_call(cudaStream_t stream, int device, const F& check_pointers) {
  const RelaxedCapture relaxed;
  LBOPT_TRY(check_stream(stream, device));
  return check_pointers();
}

lbopt_status check_state_pointers(const StateRef& st, int device, const char* codes, const char* scales,
                                  long long slot) {
  LBOPT_TRY(check_pointer(st.codes, device, codes, slot));
  return check_pointer(st.scales, device, scales, slot);
}

lbopt_status check_plan_pointers(const StepPlan& plan) {
  const int d = plan.device.id;
  for (size_t i = 0; i < plan.slots.size(); ++i) {
    const StepSlot& s = plan.slots[i];
    const long long n = (long long)i;
    LBOPT_TRY(check_pointer(s.param, d, "param", n));
    LBOPT_TRY(check_pointer(s.grad, d, "grad", n));
    static const char* const codes[kMaxStates] = {"states[0].codes", "states[1].codes", "states[2].codes"};
    static const char* const scales[kMaxStates] = {"states[0].scales", "states[1].scales", "states[2].scales"};
    for (int k = 0; k < kMaxStates; ++k) LBOPT_TRY(check_state_pointers(s.states[k], d, codes[k], scales[k], n));
  }
  LBOPT_TRY(check_pointer(plan.grad_scale, d, "options.grad_scale"));
  LBOPT_TRY(check_pointer(plan.found_inf, d, "options.found_inf"));
  LBOPT_TRY(check_pointer(plan.skipped, d, "options.skipped"));
  LBOPT_TRY(check_pointer(plan.lr_scalar, d, "lr"));
  return check_pointer(plan.step_scalar, d, "step");
}

lbopt_status cuda_step(const StepPlan& plan) {
  DeviceScope scope;
  LBOPT_TRY(scope.enter(plan.device.id));
  const cudaStream_t stream = to_stream(plan.stream);
  LBOPT_TRY(check_call(stream, plan.device.id, [&] { return check_plan_pointers(plan); }));

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
  LBOPT_TRY(check_call(stream, plan.device.id, [&] {
    LBOPT_TRY(check_pointer(plan.values, plan.device.id, to_state ? "src" : "dst"));
    return check_state_pointers(plan.state, plan.device.id, to_state ? "dst.codes" : "src.codes",
                                to_state ? "dst.scales" : "src.scales", -1);
  }));
  const cuda::ConvertLaunch a{plan.kind, plan.second_moment, to_state, plan.numel, plan.values, plan.state};
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
  LBOPT_TRY(check_call(stream, plan.device.id, [&] {
    return check_state_pointers(plan.state, plan.device.id, "state.codes", "state.scales", -1);
  }));
  const lbopt_layout layout = layout_of(plan.kind, plan.numel);
  if (layout.codes_bytes)
    LBOPT_CUDA_TRY(cudaMemsetAsync(plan.state.codes, 0, size_t(layout.codes_bytes), stream), "cudaMemsetAsync");
  if (layout.scales_numel)
    LBOPT_CUDA_TRY(cudaMemsetAsync(plan.state.scales, 0, size_t(layout.scales_numel) * sizeof(float), stream),
                   "cudaMemsetAsync");
  return LBOPT_OK;
}

}  // namespace

const Backend& cuda_backend() {
  static const Backend b{"cuda", cuda_step, cuda_quantize, cuda_dequantize, cuda_state_init};
  return b;
}

}  // namespace lbopt
