// A backend runs validated plans on one device class, and says what it serves: its device class, how many devices
// of that class this process can use, and the checks of a plan that only its runtime can make. Validation and the
// entry points reach a backend through find_backend and never look inside it; adding one adds its files and a
// line here, not branches across the code.
#pragma once
#include "plan.h"

namespace lbopt {

// The devices of its class a backend can use in this process, or none and why (static text).
struct DeviceCount {
  int devices = 0;
  const char* reason = "";
};

struct Backend {
  const char* name;
  DeviceClass device;
  DeviceCount (*devices)();  // the backend asks its runtime once per process
  // Checks of a validated plan that only this backend's runtime can make (memory, streams), run last by
  // validation; values, state: how messages name a conversion's float32 tensor (NULL: it has none) and its state.
  lbopt_status (*check_step)(const StepPlan& plan);
  lbopt_status (*check_convert)(const ConvertPlan& plan, const char* values, const char* state);
  lbopt_status (*step)(const StepPlan& plan);
  lbopt_status (*quantize)(const ConvertPlan& plan);
  lbopt_status (*dequantize)(const ConvertPlan& plan);
  lbopt_status (*state_init)(const ConvertPlan& plan);
};

const Backend& cpu_backend();
#if LBOPT_WITH_CUDA
const Backend& cuda_backend();
#endif

// The backend of a device class, or NULL where this build has none.
inline const Backend* find_backend(DeviceClass cls) {
  const Backend* const backends[] = {
      &cpu_backend(),
#if LBOPT_WITH_CUDA
      &cuda_backend(),
#endif
  };
  for (const Backend* b : backends)
    if (b->device == cls) return b;
  return nullptr;
}

// The backend for a device that validation accepted (validation refuses devices no backend serves).
inline const Backend& backend_for(const Device& device) { return *find_backend(device.cls); }

}  // namespace lbopt
