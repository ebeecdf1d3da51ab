// The CUDA backend's checks of a validated plan that only the CUDA runtime can make (validate_cuda.cu): its
// pointers are memory of that device, its stream belongs to it. Validation runs them last, through the backend.
#pragma once
#include "../plan.h"

namespace lbopt {

lbopt_status validate_cuda_step(const StepPlan& plan);
// values, state: how messages name the plan's float32 tensor (NULL: it has none) and its state.
lbopt_status validate_cuda_convert(const ConvertPlan& plan, const char* values, const char* state);

}  // namespace lbopt
