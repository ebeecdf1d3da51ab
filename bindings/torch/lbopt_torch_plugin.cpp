// lbopt's operator registry in libtorch's. Loaded (torch.ops.load_library from Python, or linked or dlopened by a
// C++ program), this library registers every operator that lbopt_op_count / lbopt_op_schema list as
// torch.ops.lbopt.<name>: the schemas lbopt.torch_ops would generate (docs/plugins.md), CPU and CUDA kernels that
// call lbopt_op_invoke on DLPack views of the tensors (no copies, so they validate exactly as the C entry points),
// and Meta kernels that do nothing (the ops return nothing and only write their arguments) for FakeTensor tracing
// and torch.compile. Nothing here is written per operator.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#if LBOPT_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <charconv>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lbopt.h"
#include "lbopt/torch.hpp"

namespace {

// lbopt.adamw_step.4bit -> adamw_step_4bit
std::string torch_name(const char* registry_name) {
  std::string name(registry_name);
  if (name.rfind("lbopt.", 0) == 0) name.erase(0, 6);
  for (char& c : name)
    if (c == '.') c = '_';
  return name;
}

// A default as a schema writes it, read back as the same value: a double's shortest round-trip digits
std::string default_of(const lbopt_attr_arg& a) {
  switch (a.type) {
    case LBOPT_ATTR_DOUBLE: {
      char buf[64];
      const auto end = std::to_chars(buf, buf + sizeof buf, a.default_double).ptr;
      std::string s(buf, end);
      return s.find_first_of(".eEn") == std::string::npos ? s + ".0" : s;
    }
    case LBOPT_ATTR_INT64:
      return std::to_string(a.default_int);
    case LBOPT_ATTR_BOOL:
      return a.default_int ? "True" : "False";
    default:
      return "'" + std::string(a.default_string ? a.default_string : "") + "'";
  }
}

const char* type_of(int32_t attr_type) {
  switch (attr_type) {
    case LBOPT_ATTR_DOUBLE: return "float";
    case LBOPT_ATTR_INT64: return "int";
    case LBOPT_ATTR_BOOL: return "bool";
    default: return "str";
  }
}

// Tensors in the registry's order, those the operator writes annotated as mutated, optional ones as Tensor?;
// then the attributes with the registry's defaults. Every op returns nothing.
std::string schema_of(const lbopt_op_info& op) {
  std::string s = torch_name(op.name) + "(";
  char alias = 'a';
  for (size_t k = 0; k < op.n_tensors; ++k) {
    const lbopt_tensor_arg& t = op.tensors[k];
    s += k ? ", " : "";
    s += t.role == LBOPT_ROLE_IN ? std::string("Tensor") : std::string("Tensor(") + alias++ + "!)";
    s += std::string(t.optional ? "? " : " ") + t.name;
  }
  for (size_t k = 0; k < op.n_attrs; ++k) {
    const lbopt_attr_arg& a = op.attrs[k];
    s += std::string(op.n_tensors + k ? ", " : "") + type_of(a.type) + " " + a.name;
    if (!a.required) s += "=" + default_of(a);
  }
  return s + ") -> ()";
}

using lbopt::torch::detail::view_of;  // the C++ optimizers' DLPack view, one definition

// The library's status as torch's exception of the same kind as lbopt.torch raises (TypeError, ValueError,
// RuntimeError), with its message.
void check(lbopt_status status) {
  if (status == LBOPT_OK) return;
  const char* message = lbopt_last_error();
  if (!message || !*message) message = lbopt_status_string(status);
  const bool type_error = status == LBOPT_ERR_DTYPE || status == LBOPT_ERR_STRUCT_SIZE;
  TORCH_CHECK_TYPE(!type_error, message);
  TORCH_CHECK_VALUE(status > LBOPT_ERR_NONFINITE, message);  // every status up to NONFINITE but the two above
  TORCH_CHECK(false, message);
}

// The CPU and CUDA kernel of one operator: its tensors and attributes off the stack, one lbopt_op_invoke.
class Invoke final : public c10::OperatorKernel {
 public:
  explicit Invoke(const lbopt_op_info* op) : op_(op) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n_tensors = op_->n_tensors, n_args = n_tensors + op_->n_attrs;
    const auto args = torch::jit::last(*stack, n_args);
    std::vector<DLTensor> views(n_tensors);
    std::vector<const DLTensor*> tensors(n_tensors, nullptr);
    std::optional<c10::Device> device;
    for (size_t k = 0; k < n_tensors; ++k) {
      if (args[k].isNone()) continue;
      const at::Tensor& t = args[k].toTensor();
      views[k] = view_of(t);
      tensors[k] = &views[k];
      if (!device) device = t.device();
    }
    // every attribute is on the stack: the dispatcher has filled in the schema's defaults, the registry's own
    std::vector<lbopt_attr> attrs(op_->n_attrs);
    for (size_t k = 0; k < op_->n_attrs; ++k) {
      const c10::IValue& value = args[n_tensors + k];
      lbopt_attr& a = attrs[k];
      a.name = op_->attrs[k].name;
      a.type = op_->attrs[k].type;
      if (a.type == LBOPT_ATTR_DOUBLE) a.f = value.toDouble();
      else if (a.type == LBOPT_ATTR_STRING) a.s = value.toStringRef().c_str();
      else a.i = a.type == LBOPT_ATTR_BOOL ? int64_t(value.toBool()) : value.toInt();
    }
    check(lbopt_op_invoke(op_, tensors.data(), n_tensors, attrs.data(), attrs.size(), stream(device)));
    torch::jit::drop(*stack, n_args);
  }

 private:
  static void* stream(const std::optional<c10::Device>& device) {
#if LBOPT_TORCH_CUDA
    if (device && device->is_cuda()) return c10::cuda::getCurrentCUDAStream(device->index()).stream();
#else
    (void)device;
#endif
    return nullptr;
  }

  const lbopt_op_info* op_;
};

// The Meta kernel of every operator: the ops return nothing, so tracing has nothing to compute.
void no_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  torch::jit::drop(*stack, op.schema().arguments().size());
}

}  // namespace

TORCH_LIBRARY(lbopt, m) {
  for (size_t i = 0; i < lbopt_op_count(); ++i) {
    const lbopt_op_info* op = lbopt_op_schema(i);
    const std::string name = torch_name(op->name);
    m.def(schema_of(*op).c_str());
    for (const auto key : {c10::DispatchKey::CPU, c10::DispatchKey::CUDA}) {
      auto kernel = torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Invoke>(op));
      m.impl(name.c_str(), torch::dispatch(key, std::move(kernel)));
    }
    auto meta = torch::CppFunction::makeFromBoxedFunction<&no_op>();
    m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::Meta, std::move(meta)));
  }
}
