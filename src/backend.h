// A backend runs validated plans on one device class. The entry points pick one by device and never look inside
// it; adding the CUDA backend adds a file, not branches across the code.
#pragma once
#include "plan.h"

namespace lbopt {

struct Backend {
  const char* name;
  lbopt_status (*step)(const StepPlan& plan);
  lbopt_status (*quantize)(const ConvertPlan& plan);
  lbopt_status (*dequantize)(const ConvertPlan& plan);
  lbopt_status (*state_init)(const ConvertPlan& plan);
};

const Backend& cpu_backend();
#if LBOPT_WITH_CUDA
const Backend& cuda_backend();
#endif

// The backend for a device that validation accepted (validation refuses devices no backend serves).
inline const Backend& backend_for(const Device& device) {
#if LBOPT_WITH_CUDA
  if (device.cls == DeviceClass::kCuda) return cuda_backend();
#endif
  (void)device;
  return cpu_backend();
}

}  // namespace lbopt
