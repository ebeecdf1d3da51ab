// The checks of a validated plan that only the CUDA runtime can make: every pointer of a tensor that claims a CUDA
// device is memory of that device, and the stream belongs to it. validate.cpp runs them last, so that
// lbopt_step_validate refuses what lbopt_step would, with the same messages, before anything is launched.
#include <stdio.h>

#include "cuda_status.h"
#include "validate_cuda.h"

namespace lbopt {
namespace {

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

// what: the caller's name of the stream argument.
lbopt_status check_stream(void* stream, int device, const char* what) {
  const cudaStream_t s = to_stream(stream);
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return LBOPT_OK;
  // A capturing stream refuses cudaStreamGetDevice; a launch into another device's stream fails by itself
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LBOPT_CUDA_TRY(cudaStreamIsCapturing(s, &capture), what);
  if (capture != cudaStreamCaptureStatusNone) return LBOPT_OK;
  int owner = -1;
  LBOPT_CUDA_TRY(cudaStreamGetDevice(s, &owner), what);
  if (owner != device)
    return fail(LBOPT_ERR_DEVICE, "%s: belongs to cuda:%d but the tensors are on cuda:%d", what, owner, device);
  return LBOPT_OK;
}

// A tensor claimed to be on cuda:device must point into device (or managed) memory of that device. what: the
// caller's field, after "slots[slot]." where slot >= 0.
lbopt_status check_pointer(const void* p, int device, const char* what, long long slot = -1) {
  if (!p) return LBOPT_OK;  // empty tensor or absent state
  char name[96];
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

// A state's codes and scales, named field.codes and field.scales.
lbopt_status check_state_pointers(const StateRef& st, int device, const char* field, long long slot) {
  char name[64];
  snprintf(name, sizeof name, "%s.codes", field);
  LBOPT_TRY(check_pointer(st.codes, device, name, slot));
  snprintf(name, sizeof name, "%s.scales", field);
  return check_pointer(st.scales, device, name, slot);
}

}  // namespace

lbopt_status validate_cuda_step(const StepPlan& plan) {
  const RelaxedCapture relaxed;
  const int d = plan.device.id;
  LBOPT_TRY(check_stream(plan.stream, d, "options.stream"));
  if (plan.devices_known) return LBOPT_OK;
  for (size_t i = 0; i < plan.slots.size(); ++i) {
    const StepSlot& s = plan.slots[i];
    const long long n = (long long)i;
    LBOPT_TRY(check_pointer(s.param, d, "param", n));
    LBOPT_TRY(check_pointer(s.grad, d, "grad", n));
    for (int k = 0; k < kMaxStates; ++k) LBOPT_TRY(check_state_pointers(s.states[k], d, plan.state_fields[k], n));
  }
  LBOPT_TRY(check_pointer(plan.grad_scale, d, "options.grad_scale"));
  LBOPT_TRY(check_pointer(plan.found_inf, d, "options.found_inf"));
  LBOPT_TRY(check_pointer(plan.skipped, d, "options.skipped"));
  LBOPT_TRY(check_pointer(plan.lr_scalar, d, "lr"));
  return check_pointer(plan.step_scalar, d, "step");
}

lbopt_status validate_cuda_convert(const ConvertPlan& plan, const char* values, const char* state) {
  const RelaxedCapture relaxed;
  LBOPT_TRY(check_stream(plan.stream, plan.device.id, "stream"));
  if (values) LBOPT_TRY(check_pointer(plan.values, plan.device.id, values));
  return check_state_pointers(plan.state, plan.device.id, state, -1);
}

}  // namespace lbopt
