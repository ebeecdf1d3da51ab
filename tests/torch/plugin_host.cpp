// The libtorch plugin from C++ alone: a program that knows nothing of lbopt dlopens liblbopt_torch.so, finds
// lbopt::adamw_step_fp32 in libtorch's dispatcher, steps a param through it, and sees a refused call throw
// c10::ValueError with the library's message, writing nothing.
// usage: torch_plugin_host PATH/liblbopt_torch.so
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>

#include <cstdio>
#include <string>

namespace {

// The op's boxed call with the arguments given, then every other argument's schema default.
void call(const c10::OperatorHandle& op, torch::jit::Stack stack) {
  const auto& args = op.schema().arguments();
  for (size_t k = stack.size(); k < args.size(); ++k) stack.push_back(*args[k].default_value());
  op.callBoxed(&stack);
}

int fail(const char* what) {
  std::fprintf(stderr, "FAIL: %s\n", what);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return fail("usage: torch_plugin_host PATH/liblbopt_torch.so");
  if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) return fail(dlerror());
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("lbopt::adamw_step_fp32", "");
  const int64_t n = 1000;
  at::Tensor p = at::linspace(-1, 1, n), g = at::sin(at::arange(n, at::kFloat)), m = at::zeros({n}),
             v = at::zeros({n});
  const at::Tensor p0 = p.clone();
  const double lr = 1e-2;
  call(op, {p, g, m, c10::IValue(), v, c10::IValue(), c10::IValue(), c10::IValue(), c10::IValue(), lr, int64_t(1),
            0.9, 0.999, 1e-8, 0.0});
  // AdamW's first step with fp32 states moves each param by lr against its gradient's sign
  const at::Tensor expected = p0 - lr * at::sign(g);
  if (!at::allclose(p, expected, 1e-5, 1e-6)) return fail("the first step is not p - lr sign(g)");
  if (!at::allclose(m, 0.1 * g)) return fail("m is not (1 - beta1) g");

  const at::Tensor p1 = p.clone(), m1 = m.clone();
  try {
    call(op, {p, g, m, c10::IValue(), v, c10::IValue(), c10::IValue(), c10::IValue(), c10::IValue(), -1.0,
              int64_t(2)});
    return fail("a negative lr was not refused");
  } catch (const c10::ValueError& e) {
    if (std::string(e.what()).find("lr") == std::string::npos) return fail(e.what());
  }
  if (!at::equal(p, p1) || !at::equal(m, m1)) return fail("a refused call wrote");
  std::printf("lbopt::adamw_step_fp32 through libtorch's dispatcher: stepped, and refused lr = -1 writing nothing\n");
  return 0;
}
