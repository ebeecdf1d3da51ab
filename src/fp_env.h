// The CPU kernels' results must not depend on the caller's floating-point environment. Hosts such as XLA run
// their threads with denormals flushed (FTZ/DAZ), which zeroes the subnormal intermediates of the FP8 decode and
// the smallest states, and a caller may have changed the rounding mode. Every CPU call therefore runs in the
// default environment and hands the caller's back; the pool's workers run in it for their whole life.
#pragma once
#include <fenv.h>

namespace lbopt {

class DefaultFpEnv {
 public:
  DefaultFpEnv() {
    fegetenv(&saved_);
    fesetenv(FE_DFL_ENV);
  }
  ~DefaultFpEnv() { fesetenv(&saved_); }
  DefaultFpEnv(const DefaultFpEnv&) = delete;
  DefaultFpEnv& operator=(const DefaultFpEnv&) = delete;

 private:
  fenv_t saved_;
};

}  // namespace lbopt
