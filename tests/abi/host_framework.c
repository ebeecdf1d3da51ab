/* A "host framework" that has never seen lbopt.h: it dlopens the library given on the command line, checks the
 * ABI version, walks the operator registry, builds its own dispatch table from the schemas, and trains a small
 * linear model with the 4-bit AdamW operator and a learning rate that changes every step. It declares the few
 * registry structures it needs itself, as a plugin loader would (only DLPack is shared). */
#include <dlfcn.h>
#include <dlpack/dlpack.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char* name;
  int32_t role;
  uint32_t dtypes;
  int32_t optional;
  const char* shape;
} tensor_arg;
typedef struct {
  const char* name;
  int32_t type;
  int32_t required;
  double default_double;
  int64_t default_int;
  const char* default_string;
} attr_arg;
typedef struct {
  uint32_t struct_size;
  const char* name;
  int32_t version;
  const char* doc;
  size_t n_tensors;
  const tensor_arg* tensors;
  size_t n_attrs;
  const attr_arg* attrs;
} op_info;
typedef struct {
  const char* name;
  int32_t type;
  double f;
  int64_t i;
  const char* s;
} attr;
enum { ATTR_DOUBLE = 0, ATTR_INT64 = 1, ATTR_BOOL = 2, ATTR_STRING = 3 };

typedef int (*invoke_fn)(const op_info*, const DLTensor* const*, size_t, const attr*, size_t, void*);

/* The framework's dispatch table: its op names mapped to the plugin's operators. */
typedef struct {
  const op_info* step4;
  const op_info* layout;
  const op_info* init;
} dispatch;

static DLTensor tensor(void* data, int64_t* shape, uint8_t code, uint8_t bits) {
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

int main(int argc, char** argv) {
  void* lib;
  uint32_t (*version)(void);
  size_t (*count)(void);
  const op_info* (*schema)(size_t);
  const char* (*last_error)(void);
  invoke_fn invoke;
  dispatch table = {NULL, NULL, NULL};
  size_t i, j;
  if (argc < 2) return 2;
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf("dlopen: %s\n", dlerror());
    return 1;
  }
  *(void**)&version = dlsym(lib, "lbopt_version");
  *(void**)&count = dlsym(lib, "lbopt_op_count");
  *(void**)&schema = dlsym(lib, "lbopt_op_schema");
  *(void**)&invoke = dlsym(lib, "lbopt_op_invoke");
  *(void**)&last_error = dlsym(lib, "lbopt_last_error");
  if (!version || !count || !schema || !invoke || !last_error || version() >> 16 != 0) {
    printf("not an lbopt ABI 0 library\n");
    return 1;
  }
  for (i = 0; i < count(); ++i) {
    const op_info* op = schema(i);
    printf("op %-38s v%d  tensors:", op->name, op->version);
    for (j = 0; j < op->n_tensors; ++j) printf(" %s%s", op->tensors[j].name, op->tensors[j].optional ? "?" : "");
    printf("  attrs:");
    for (j = 0; j < op->n_attrs; ++j) printf(" %s%s", op->attrs[j].name, op->attrs[j].required ? "!" : "");
    printf("\n");
    if (strcmp(op->name, "lbopt.adamw_step.4bit") == 0) table.step4 = op;
    if (strcmp(op->name, "lbopt.state_layout") == 0) table.layout = op;
    if (strcmp(op->name, "lbopt.state_init") == 0) table.init = op;
  }
  if (!table.step4 || !table.layout || !table.init || table.step4->n_tensors != 9) {
    printf("registry lacks the operators this framework needs\n");
    return 1;
  }
  {
    enum { N = 4096, SAMPLES = 64, STEPS = 200 };
    static float w[N], g[N], x[SAMPLES][N], y[SAMPLES];
    int64_t n = N, sizes[4], four = 4, codes_n, scales_n;
    unsigned seed = 1;
    double first_loss = 0, loss = 0;
    DLTensor tout = tensor(sizes, &four, kDLInt, 64);
    const DLTensor* lay_args[1];
    attr lay_attrs[2];
    uint8_t *mc, *vc;
    float *ms, *vs;
    DLTensor tw, tg, tmc, tms, tvc, tvs;
    const DLTensor* step_args[9];
    int s, k;
    lay_args[0] = &tout;
    lay_attrs[0].name = "kind"; lay_attrs[0].type = ATTR_STRING; lay_attrs[0].s = "4bit";
    lay_attrs[1].name = "numel"; lay_attrs[1].type = ATTR_INT64; lay_attrs[1].i = N;
    if (invoke(table.layout, lay_args, 1, lay_attrs, 2, NULL) != 0) {
      printf("state_layout: %s\n", last_error());
      return 1;
    }
    codes_n = sizes[0];
    scales_n = sizes[2];
    mc = calloc((size_t)codes_n, 1); vc = calloc((size_t)codes_n, 1);
    ms = calloc((size_t)scales_n, 4); vs = calloc((size_t)scales_n, 4);
    tw = tensor(w, &n, kDLFloat, 32); tg = tensor(g, &n, kDLFloat, 32);
    tmc = tensor(mc, &codes_n, kDLUInt, 8); tvc = tensor(vc, &codes_n, kDLUInt, 8);
    tms = tensor(ms, &scales_n, kDLFloat, 32); tvs = tensor(vs, &scales_n, kDLFloat, 32);
    {
      const DLTensor* init_args[2];
      init_args[0] = &tmc; init_args[1] = &tms;
      if (invoke(table.init, init_args, 2, lay_attrs, 2, NULL) != 0) return 1;
      init_args[0] = &tvc; init_args[1] = &tvs;
      if (invoke(table.init, init_args, 2, lay_attrs, 2, NULL) != 0) return 1;
    }
    for (s = 0; s < SAMPLES; ++s) {
      double t = 0;
      for (k = 0; k < N; ++k) {
        seed = seed * 1664525u + 1013904223u;
        x[s][k] = ((float)(seed >> 8) / 16777216.0f - 0.5f) / 16.0f;
        t += x[s][k] * (k % 7 == 0 ? 0.5 : 0.0);
      }
      y[s] = (float)t;
    }
    step_args[0] = &tw; step_args[1] = &tg; step_args[2] = &tmc; step_args[3] = &tms;
    step_args[4] = &tvc; step_args[5] = &tvs; step_args[6] = NULL; step_args[7] = NULL; step_args[8] = NULL;
    for (s = 1; s <= STEPS; ++s) {
      attr a[2];
      int q;
      memset(g, 0, sizeof g);
      loss = 0;
      for (q = 0; q < SAMPLES; ++q) {
        double e = -y[q];
        for (k = 0; k < N; ++k) e += x[q][k] * w[k];
        loss += 0.5 * e * e / SAMPLES;
        for (k = 0; k < N; ++k) g[k] += (float)(e * x[q][k] / SAMPLES);
      }
      if (s == 1) first_loss = loss;
      a[0].name = "lr"; a[0].type = ATTR_DOUBLE; a[0].f = 1e-2 * 0.5 * (1 + cos(3.14159265 * s / STEPS));
      a[1].name = "step"; a[1].type = ATTR_INT64; a[1].i = s;
      if (invoke(table.step4, step_args, 9, a, 2, NULL) != 0) {
        printf("step %d: %s\n", s, last_error());
        return 1;
      }
    }
    printf("loss %.6g -> %.6g over %d steps of lbopt.adamw_step.4bit with a cosine lr\n", first_loss, loss, STEPS);
    free(mc); free(vc); free(ms); free(vs);
    if (!(loss < 0.05 * first_loss)) return 1;
  }
  dlclose(lib);
  return 0;
}
