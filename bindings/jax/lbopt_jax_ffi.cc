// One XLA FFI handler for every operator of lbopt's registry (bindings/python/lbopt/jax.py registers it as the
// custom call target "lbopt_invoke"). Attributes: lbopt_op (the operator's registry name), lbopt_present (bit k
// set when the operator's tensor k is passed), then the operator's own attributes by their registry names. Buffers:
// the present tensors the operator reads (role in or inout) are the call's arguments, in registry order; those it
// writes (out or inout) are its results, in registry order, each inout result aliased to its argument by the
// caller, so no state is copied. The handler only translates: lbopt_op_invoke validates and runs the step.
#include <stdint.h>

#include <string>
#include <string_view>
#include <vector>

#include "lbopt.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

bool dl_dtype(ffi::DataType t, DLDataType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = {kDLFloat, 32, 1}; return true;
    case ffi::DataType::F64: *out = {kDLFloat, 64, 1}; return true;
    case ffi::DataType::F16: *out = {kDLFloat, 16, 1}; return true;
    case ffi::DataType::BF16: *out = {kDLBfloat, 16, 1}; return true;
    case ffi::DataType::U8: *out = {kDLUInt, 8, 1}; return true;
    case ffi::DataType::S32: *out = {kDLInt, 32, 1}; return true;
    case ffi::DataType::S64: *out = {kDLInt, 64, 1}; return true;
    default: return false;
  }
}

// A DLTensor over an XLA buffer: dense row-major host memory (this handler is registered for the CPU platform).
struct View {
  DLTensor t{};
  std::vector<int64_t> shape;
};

ffi::Error view_of(const ffi::AnyBuffer& b, const lbopt_tensor_arg& arg, View* v) {
  if (!dl_dtype(b.element_type(), &v->t.dtype))
    return ffi::Error::InvalidArgument(std::string(arg.name) + ": an XLA element type lbopt does not take");
  const auto dims = b.dimensions();
  v->shape.assign(dims.begin(), dims.end());
  v->t.data = b.untyped_data();
  v->t.device = {kDLCPU, 0};
  v->t.ndim = int(v->shape.size());
  v->t.shape = v->shape.data();
  return ffi::Error::Success();
}

ffi::Error invoke(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  auto name = attrs.get<std::string_view>("lbopt_op");
  if (name.has_error()) return name.error();
  auto present = attrs.get<int64_t>("lbopt_present");
  if (present.has_error()) return present.error();
  const std::string op_name(*name);
  const lbopt_op_info* op = lbopt_op_find(op_name.c_str());
  if (!op) return ffi::Error::InvalidArgument("lbopt_op: no lbopt operator is named '" + op_name + "'");

  std::vector<View> views(op->n_tensors);
  std::vector<const DLTensor*> tensors(op->n_tensors, nullptr);
  size_t next_arg = 0, next_ret = 0;
  for (size_t k = 0; k < op->n_tensors; ++k) {
    if (!((*present >> k) & 1)) continue;
    const lbopt_tensor_arg& arg = op->tensors[k];
    if (arg.role == LBOPT_ROLE_IN) {
      auto b = args.get<ffi::AnyBuffer>(next_arg++);
      if (b.has_error()) return b.error();
      if (auto e = view_of(*b, arg, &views[k]); !e.success()) return e;
    } else {
      if (arg.role == LBOPT_ROLE_INOUT) ++next_arg;  // the result aliases this argument
      auto r = rets.get<ffi::AnyBuffer>(next_ret++);
      if (r.has_error()) return r.error();
      if (auto e = view_of(**r, arg, &views[k]); !e.success()) return e;
    }
    tensors[k] = &views[k].t;
  }

  std::vector<lbopt_attr> values;
  std::vector<std::string> strings(op->n_attrs);
  for (size_t i = 0; i < op->n_attrs; ++i) {
    const lbopt_attr_arg& a = op->attrs[i];
    if (!attrs.contains(a.name)) continue;  // the registry fills in its default, or refuses a required one
    lbopt_attr v{a.name, a.type, 0.0, 0, nullptr};
    if (a.type == LBOPT_ATTR_DOUBLE) {
      auto x = attrs.get<double>(a.name);
      if (x.has_error()) return x.error();
      v.f = *x;
    } else if (a.type == LBOPT_ATTR_STRING) {
      auto x = attrs.get<std::string_view>(a.name);
      if (x.has_error()) return x.error();
      strings[i] = std::string(*x);
      v.s = strings[i].c_str();
    } else if (a.type == LBOPT_ATTR_BOOL) {
      auto x = attrs.get<bool>(a.name);
      if (x.has_error()) return x.error();
      v.i = *x ? 1 : 0;
    } else {
      auto x = attrs.get<int64_t>(a.name);
      if (x.has_error()) return x.error();
      v.i = *x;
    }
    values.push_back(v);
  }
  if (lbopt_op_invoke(op, tensors.data(), tensors.size(), values.data(), values.size(), nullptr) != LBOPT_OK)
    return ffi::Error::InvalidArgument(op_name + ": " + lbopt_last_error());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LbOptInvoke, invoke,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs<ffi::Dictionary>());
