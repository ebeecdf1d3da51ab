// Errors as values: every entry point returns an lbopt_status and leaves a precise per-thread message.
#pragma once
#include <stdarg.h>

#include "lbopt.h"

namespace lbopt {

// Record the calling thread's message ("" for success) and return status.
lbopt_status fail(lbopt_status status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void clear_error();

// Evaluate an expression returning lbopt_status and return it from the caller unless it is LBOPT_OK.
#define LBOPT_TRY(expr)                           \
  do {                                            \
    const lbopt_status lbopt_try_status_ = (expr); \
    if (lbopt_try_status_ != LBOPT_OK) return lbopt_try_status_; \
  } while (0)

}  // namespace lbopt
