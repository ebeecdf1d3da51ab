// The codebooks in device constant memory, from the same generated lists as the host tables.
#pragma once
#include "../codebooks.h"
#include "../quant.h"

namespace lbopt::cuda {

__constant__ float kSigned4Values[16] = {LBOPT_SIGNED4_VALUES};
__constant__ float kSigned4Mids[16] = {LBOPT_SIGNED4_MIDS};
__constant__ float kUnsigned4Values[16] = {LBOPT_UNSIGNED4_VALUES};
__constant__ float kUnsigned4Mids[16] = {LBOPT_UNSIGNED4_MIDS};
__constant__ float kSigned8Values[256] = {LBOPT_SIGNED8_VALUES};
__constant__ float kSigned8Mids[256] = {LBOPT_SIGNED8_MIDS};
__constant__ float kUnsigned8Values[256] = {LBOPT_UNSIGNED8_VALUES};
__constant__ float kUnsigned8Mids[256] = {LBOPT_UNSIGNED8_MIDS};

// The device twin of host_codec().
__device__ __forceinline__ StateCodec device_codec(int kind, bool second_moment) {
  switch (kind) {
    case kState4Bit:
      return second_moment ? StateCodec{kind, kUnsigned4Values, kUnsigned4Mids, 16, false}
                           : StateCodec{kind, kSigned4Values, kSigned4Mids, 16, false};
    case kState8Bit:
      return second_moment ? StateCodec{kind, kUnsigned8Values, kUnsigned8Mids, 256, true}
                           : StateCodec{kind, kSigned8Values, kSigned8Mids, 256, false};
    default:
      return StateCodec{kind, nullptr, nullptr, 0, second_moment};
  }
}

}  // namespace lbopt::cuda
