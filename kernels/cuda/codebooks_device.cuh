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

__device__ __forceinline__ StateCodec device_codec(int kind, bool second_moment) {
  const CodebookTables tables{kSigned4Values, kSigned4Mids, kUnsigned4Values, kUnsigned4Mids,
                              kSigned8Values, kSigned8Mids, kUnsigned8Values, kUnsigned8Mids};
  return codec_for(kind, second_moment, tables);
}

}  // namespace lbopt::cuda
