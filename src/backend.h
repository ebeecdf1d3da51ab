// A backend runs validated plans on one device class. The entry points pick one by device and never look inside
// it; adding the CUDA backend adds a file, not branches across the code.
#pragma once
#include "validate.h"

namespace lbopt {

struct Backend {
  const char* name;
  lbopt_status (*adamw_step)(StepPlan& plan);
  lbopt_status (*quantize)(const ConvertPlan& plan);
  lbopt_status (*dequantize)(const ConvertPlan& plan);
  lbopt_status (*state_init)(const ConvertPlan& plan);
};

const Backend& cpu_backend();

// The backend for a device that validation accepted (validation refuses devices no backend serves).
const Backend& backend_for(const Device& device);

}  // namespace lbopt
