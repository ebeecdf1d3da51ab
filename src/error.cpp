#include "error.h"

#include <stdio.h>

namespace lbopt {
namespace {
thread_local char t_message[512] = "";
}

lbopt_status fail(lbopt_status status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(t_message, sizeof t_message, fmt, args);
  va_end(args);
  return status;
}

void clear_error() { t_message[0] = '\0'; }

const char* last_error() { return t_message; }

}  // namespace lbopt

extern "C" const char* lbopt_last_error(void) { return lbopt::last_error(); }

extern "C" const char* lbopt_status_string(lbopt_status status) {
  switch (status) {
    case LBOPT_OK: return "LBOPT_OK: success";
    case LBOPT_ERR_NULL_POINTER: return "LBOPT_ERR_NULL_POINTER: a required pointer is NULL";
    case LBOPT_ERR_STRUCT_SIZE: return "LBOPT_ERR_STRUCT_SIZE: struct_size is not one this library knows";
    case LBOPT_ERR_INVALID_VALUE: return "LBOPT_ERR_INVALID_VALUE: a value is out of its allowed range";
    case LBOPT_ERR_DTYPE: return "LBOPT_ERR_DTYPE: unsupported or mismatched dtype";
    case LBOPT_ERR_DEVICE: return "LBOPT_ERR_DEVICE: unsupported device or tensors on different devices";
    case LBOPT_ERR_SHAPE: return "LBOPT_ERR_SHAPE: shape or element count mismatch";
    case LBOPT_ERR_STRIDE: return "LBOPT_ERR_STRIDE: strides of no dense layout, or unlike the param's";
    case LBOPT_ERR_ALIGNMENT: return "LBOPT_ERR_ALIGNMENT: data is not aligned to its element size";
    case LBOPT_ERR_BUFFER_SIZE: return "LBOPT_ERR_BUFFER_SIZE: codes or scales buffer has the wrong size";
    case LBOPT_ERR_OVERLAP: return "LBOPT_ERR_OVERLAP: a written buffer overlaps another buffer";
    case LBOPT_ERR_NONFINITE: return "LBOPT_ERR_NONFINITE: NaN or Inf where a finite value is required";
    case LBOPT_ERR_UNSUPPORTED: return "LBOPT_ERR_UNSUPPORTED: not supported by this build or machine";
    case LBOPT_ERR_CUDA: return "LBOPT_ERR_CUDA: CUDA runtime error";
    case LBOPT_ERR_OUT_OF_MEMORY: return "LBOPT_ERR_OUT_OF_MEMORY: allocation failed";
    case LBOPT_ERR_INTERNAL: return "LBOPT_ERR_INTERNAL: internal error";
    case LBOPT_STATUS_INT32_:
    case LBOPT_STATUS_INT32_MIN_: break;
  }
  return "LBOPT_ERR_UNKNOWN: not an lbopt_status value";
}
