/* A complete C program against the public ABI: fit y = X w with 4-bit AdamW states and a learning rate that
 * changes on every call (linear warm-up, then cosine decay), and compare with 8-bit, FP8 and fp32 states.
 * Run: ./build/examples/train_c  */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lbopt.h"

#define N_FEATURES 1024
#define N_SAMPLES 2048
#define STEPS 300

static float rand_normal(unsigned* seed) {
  /* Box-Muller on a small LCG: reproducible everywhere */
  double u1, u2;
  *seed = *seed * 1664525u + 1013904223u;
  u1 = ((*seed >> 8) + 1.0) / 16777217.0;
  *seed = *seed * 1664525u + 1013904223u;
  u2 = ((*seed >> 8) + 0.5) / 16777216.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static double schedule(int step, double peak) {
  const int warm = STEPS / 10;
  if (step <= warm) return peak * step / warm;
  return peak * (0.05 + 0.95 * 0.5 * (1.0 + cos(3.141592653589793 * (step - warm) / (STEPS - warm))));
}

/* A CPU tensor view of a caller-owned buffer. */
static DLTensor view(void* data, int64_t* shape, DLDataType dtype) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

#define CHECK(call)                                                                      \
  do {                                                                                   \
    lbopt_status s_ = (call);                                                            \
    if (s_ != LBOPT_OK) {                                                                \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, lbopt_status_string(s_), lbopt_last_error()); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

/* Trains with one state kind; losses[k] receives the loss before step REPORT[k]. */
static const int REPORT[4] = {10, 30, 100, STEPS};

static void train(lbopt_state_kind kind, const float* x, const float* y, double* state_bytes, double* losses) {
  const DLDataType f32 = {kDLFloat, 32, 1};
  int64_t n = N_FEATURES, codes_n, scales_n;
  float* w = calloc(N_FEATURES, sizeof *w);
  float* g = calloc(N_FEATURES, sizeof *g);
  lbopt_layout layout;
  void *m_codes, *v_codes;
  float *m_scales, *v_scales;
  DLTensor tw, tg, tmc, tms, tvc, tvs;
  lbopt_adamw_config cfg;
  lbopt_adamw_slot slot;
  double loss = 0;
  int step, i, j, r = 0;

  /* The framework (here: this program) owns every buffer; lbopt says how big the states are. */
  CHECK(lbopt_state_layout(kind, n, &layout, sizeof layout));
  codes_n = layout.codes_numel;
  scales_n = layout.scales_numel;
  m_codes = calloc((size_t)layout.codes_bytes, 1);
  v_codes = calloc((size_t)layout.codes_bytes, 1);
  m_scales = calloc((size_t)(scales_n ? scales_n : 1), sizeof(float));
  v_scales = calloc((size_t)(scales_n ? scales_n : 1), sizeof(float));
  *state_bytes = 2.0 * ((double)layout.codes_bytes + 4.0 * (double)scales_n);

  tw = view(w, &n, f32);
  tg = view(g, &n, f32);
  tmc = view(m_codes, &codes_n, layout.codes_dtype);
  tvc = view(v_codes, &codes_n, layout.codes_dtype);
  tms = view(m_scales, &scales_n, f32);
  tvs = view(v_scales, &scales_n, f32);

  CHECK(lbopt_adamw_config_init(&cfg, sizeof cfg));
  cfg.state_kind = kind;
  cfg.weight_decay = 0.0;
  memset(&slot, 0, sizeof slot);
  slot.struct_size = sizeof slot;
  slot.param = &tw;
  slot.grad = &tg;
  slot.m.codes = &tmc;
  slot.v.codes = &tvc;
  slot.m.scales = kind == LBOPT_STATE_FP32 ? NULL : &tms;
  slot.v.scales = kind == LBOPT_STATE_FP32 ? NULL : &tvs;
  CHECK(lbopt_state_init(kind, n, slot.m, NULL));
  CHECK(lbopt_state_init(kind, n, slot.v, NULL));

  for (step = 1; step <= STEPS; ++step) {
    /* loss = mean((X w - y)^2) / 2, gradient X^T (X w - y) / N */
    memset(g, 0, N_FEATURES * sizeof *g);
    loss = 0;
    for (i = 0; i < N_SAMPLES; ++i) {
      double e = -y[i];
      for (j = 0; j < N_FEATURES; ++j) e += x[i * N_FEATURES + j] * w[j];
      loss += 0.5 * e * e / N_SAMPLES;
      for (j = 0; j < N_FEATURES; ++j) g[j] += (float)(e * x[i * N_FEATURES + j] / N_SAMPLES);
    }
    if (step == REPORT[r]) losses[r++] = loss;
    slot.step = step;
    /* a new lr on every call costs nothing: it is a plain argument */
    CHECK(lbopt_adamw_step(&cfg, schedule(step, 2e-2), &slot, 1, NULL));
  }
  free(w);
  free(g);
  free(m_codes);
  free(v_codes);
  free(m_scales);
  free(v_scales);
}

int main(void) {
  static float x[N_SAMPLES * N_FEATURES], y[N_SAMPLES], w_true[N_FEATURES];
  const char* names[] = {"4-bit", "8-bit", "fp8", "fp32"};
  unsigned seed = 7;
  int i, j, k, ok = 1;
  double final[4];
  printf("lbopt %s  %s\n", lbopt_version_string(), lbopt_build_info());
  for (j = 0; j < N_FEATURES; ++j) w_true[j] = 0.05f * rand_normal(&seed);
  for (i = 0; i < N_SAMPLES; ++i) {
    double s = 0;
    for (j = 0; j < N_FEATURES; ++j) s += (x[i * N_FEATURES + j] = rand_normal(&seed) / 32.0f) * w_true[j];
    y[i] = (float)s + 0.01f * rand_normal(&seed);
  }
  printf("noise floor of the loss: %.3g\n", 0.5 * 0.01 * 0.01);
  printf("%-6s  %-11s %-11s %-11s %-11s  %s\n", "state", "loss@10", "loss@30", "loss@100", "loss@300",
         "state bytes/param");
  for (k = 0; k < 4; ++k) {
    double bytes, losses[4];
    train((lbopt_state_kind)k, x, y, &bytes, losses);
    printf("%-6s  %-11.4g %-11.4g %-11.4g %-11.4g  %.4f\n", names[k], losses[0], losses[1], losses[2], losses[3],
           bytes / N_FEATURES);
    final[k] = losses[3];
    ok = ok && losses[3] < 0.2 * losses[0];
  }
  /* every kind converges, and to the fp32 states' loss within 10% */
  for (k = 0; k < 3; ++k) ok = ok && final[k] < 1.1 * final[3];
  return ok ? 0 : 1;
}
