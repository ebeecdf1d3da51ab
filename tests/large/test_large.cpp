// A tensor of more than 2^31 elements (bf16 params and grads, 4-bit states: about 10.7 GB) steps correctly end to
// end: 64-bit element counts, byte sizes, block and nibble indices. Every element starts equal and gets the same
// gradient, so after one step all must be equal, and equal to a small tensor's result.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lbopt.h"

static DLTensor view(void* data, int64_t* shape, uint8_t code, uint8_t bits) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = code;
  t.dtype.bits = bits;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

// One step of n elements; returns the param bits at the given indices (or 0 on failure).
static int step(int64_t n, const int64_t* probes, int n_probes, uint16_t* out, float* last_scale) {
  lbopt_layout l;
  if (lbopt_state_layout(LBOPT_STATE_4BIT, n, &l, sizeof l) != LBOPT_OK) return 0;
  uint16_t* p = (uint16_t*)malloc((size_t)n * 2);
  uint16_t* g = (uint16_t*)malloc((size_t)n * 2);
  uint8_t* mc = (uint8_t*)calloc((size_t)l.codes_bytes, 1);
  uint8_t* vc = (uint8_t*)calloc((size_t)l.codes_bytes, 1);
  float* ms = (float*)calloc((size_t)l.scales_numel, 4);
  float* vs = (float*)calloc((size_t)l.scales_numel, 4);
  if (!p || !g || !mc || !vc || !ms || !vs) {
    printf("allocation of %lld elements failed\n", (long long)n);
    return 0;
  }
  for (int64_t i = 0; i < n; ++i) {
    p[i] = 0x3f80;  // 1.0
    g[i] = (uint16_t)(i % 2 ? 0x3c00 : 0xbc00);  // +-2^-7: alternating signs inside every byte of codes
  }
  int64_t shape = n, cn = l.codes_numel, sn = l.scales_numel;
  DLTensor tp = view(p, &shape, kDLBfloat, 16), tg = view(g, &shape, kDLBfloat, 16);
  DLTensor tmc = view(mc, &cn, kDLUInt, 8), tvc = view(vc, &cn, kDLUInt, 8);
  DLTensor tms = view(ms, &sn, kDLFloat, 32), tvs = view(vs, &sn, kDLFloat, 32);
  lbopt_adamw_config cfg;
  lbopt_adamw_config_init(&cfg, sizeof cfg);
  lbopt_adamw_slot slot;
  memset(&slot, 0, sizeof slot);
  slot.struct_size = sizeof slot;
  slot.param = &tp;
  slot.grad = &tg;
  slot.m.codes = &tmc;
  slot.m.scales = &tms;
  slot.v.codes = &tvc;
  slot.v.scales = &tvs;
  slot.step = 1;
  const lbopt_status st = lbopt_adamw_step(&cfg, 1e-2, &slot, 1, NULL);
  if (st != LBOPT_OK) {
    printf("step: %s\n", lbopt_last_error());
    return 0;
  }
  for (int k = 0; k < n_probes; ++k) out[k] = p[probes[k]];
  *last_scale = vs[sn - 1];
  int uniform = 1;  // every even element equal, every odd element equal
  for (int64_t i = 2; i < n && uniform; ++i) uniform = p[i] == p[i % 2];
  free(p); free(g); free(mc); free(vc); free(ms); free(vs);
  return uniform ? 1 : 0;
}

int main(void) {
  const int64_t n = (int64_t(1) << 31) + 1001;  // > 2^31 elements, odd (a half-used last code byte)
  const int64_t probes_big[4] = {0, 1, n - 2, n - 1};
  const int64_t probes_small[4] = {0, 1, 1001, 1002};  // the same parities as the big probes
  uint16_t big[4], small[4];
  float scale_big, scale_small;
  if (!step(n, probes_big, 4, big, &scale_big)) return 1;
  if (!step(1003, probes_small, 4, small, &scale_small)) return 1;
  printf("params after one step: %04x %04x ... %04x %04x (small tensor: %04x %04x)\n", big[0], big[1], big[2], big[3],
         small[0], small[1]);
  const int ok = big[0] == small[0] && big[1] == small[1] && big[2] == small[2] && big[3] == small[3] &&
                 big[0] != 0x3f80 && scale_big == scale_small;
  printf("%s\n", ok ? "ok: 64-bit indexing end to end" : "MISMATCH");
  return ok ? 0 : 1;
}
