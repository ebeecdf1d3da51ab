// One XLA FFI handler for every operator of lbopt's registry (bindings/python/lbopt/jax.py registers it as the
// custom call target "lbopt_invoke"). Attributes: lbopt_op (the operator's registry name), lbopt_present (bit k
// set when the operator's tensor k is passed), optionally lbopt_scalars (see below), then the operator's own
// attributes by their registry names. Buffers: the present tensors the operator reads (role in or inout) are the
// call's arguments, in registry order; those it writes (out or inout) are its results, in registry order, each
// inout result aliased to its argument by the caller, so no state is copied.
// lbopt_scalars: comma-separated names of operator attributes whose values arrive as the call's trailing
// arguments, one per name in that order, after the tensors: one-element float32, float64, bfloat16 or float16
// buffers, converted to the attribute's type. A traced hyper-parameter (a schedule's value, an
// optax.inject_hyperparams state) so stays out of the compiled program's constants, while a Python number stays
// an attribute with its exact double. The handler only translates: lbopt_op_invoke validates and runs the step.
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

// The value of a one-element float buffer, as a double (exact for every type taken).
ffi::Error scalar_of(const ffi::AnyBuffer& b, const std::string& name, double* out) {
  if (b.element_count() != 1)
    return ffi::Error::InvalidArgument("lbopt_scalars: " + name + " has " + std::to_string(b.element_count()) +
                                       " elements, not 1");
  const void* d = b.untyped_data();
  uint16_t h = 0;
  switch (b.element_type()) {
    case ffi::DataType::F32: *out = *static_cast<const float*>(d); return ffi::Error::Success();
    case ffi::DataType::F64: *out = *static_cast<const double*>(d); return ffi::Error::Success();
    case ffi::DataType::BF16: {
      std::memcpy(&h, d, 2);
      const uint32_t bits = uint32_t(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      *out = f;
      return ffi::Error::Success();
    }
    case ffi::DataType::F16: {
      std::memcpy(&h, d, 2);
      const int biased = (h >> 10) & 0x1f, man = h & 0x3ff;
      const double mag = biased == 0x1f ? (man ? NAN : INFINITY)
                         : biased == 0  ? std::ldexp(double(man), -24)
                                        : std::ldexp(double(man | 0x400), biased - 25);
      *out = (h & 0x8000) ? -mag : mag;
      return ffi::Error::Success();
    }
    default:
      return ffi::Error::InvalidArgument("lbopt_scalars: " + name +
                                         " is not a float32, float64, bfloat16 or float16 buffer");
  }
}

// One attribute's value from a scalar argument, in the attribute's type.
ffi::Error attr_of_scalar(const lbopt_attr_arg& a, double x, lbopt_attr* v) {
  if (a.type == LBOPT_ATTR_DOUBLE) {
    v->f = x;
  } else if (a.type == LBOPT_ATTR_BOOL) {
    v->i = x != 0.0;
  } else if (a.type == LBOPT_ATTR_INT64 && std::nearbyint(x) == x && std::fabs(x) < 9.0e18) {
    v->i = int64_t(x);
  } else {
    return ffi::Error::InvalidArgument("lbopt_scalars: " + std::string(a.name) +
                                       (a.type == LBOPT_ATTR_INT64 ? " needs an integral value"
                                                                   : " is a string attribute, not a number"));
  }
  return ffi::Error::Success();
}

// lbopt_scalars' names, each an attribute of op named once, with their values from the arguments after the
// tensors (those from first_scalar on): values[k] for op->attrs[k], given[k] set where a scalar gives it.
ffi::Error read_scalars(const lbopt_op_info* op, std::string_view list, const ffi::RemainingArgs& args,
                        size_t first_scalar, std::vector<lbopt_attr>* values, std::vector<bool>* given) {
  std::vector<std::string> names;
  for (size_t at = 0; !list.empty() && at <= list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    names.emplace_back(list.substr(at, end - at));
    at = end + 1;
  }
  const size_t n_args = args.size() > first_scalar ? args.size() - first_scalar : 0;
  if (names.size() != n_args)
    return ffi::Error::InvalidArgument("lbopt_scalars names " + std::to_string(names.size()) +
                                       " attributes, but " + std::to_string(n_args) +
                                       " scalar arguments follow the tensors");
  for (size_t j = 0; j < names.size(); ++j) {
    size_t k = 0;
    while (k < op->n_attrs && names[j] != op->attrs[k].name) ++k;
    if (k == op->n_attrs)
      return ffi::Error::InvalidArgument("lbopt_scalars: '" + names[j] + "' is not an attribute of " + op->name);
    if ((*given)[k]) return ffi::Error::InvalidArgument("lbopt_scalars: '" + names[j] + "' is named twice");
    auto b = args.get<ffi::AnyBuffer>(first_scalar + j);
    if (b.has_error()) return b.error();
    double x = 0.0;
    if (auto e = scalar_of(*b, names[j], &x); !e.success()) return e;
    (*values)[k] = lbopt_attr{op->attrs[k].name, op->attrs[k].type, 0.0, 0, nullptr};
    if (auto e = attr_of_scalar(op->attrs[k], x, &(*values)[k]); !e.success()) return e;
    (*given)[k] = true;
  }
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

  if (args.size() < next_arg)
    return ffi::Error::InvalidArgument("the call has " + std::to_string(args.size()) + " arguments, the tensors "
                                       "lbopt_present names need " + std::to_string(next_arg));
  std::vector<lbopt_attr> scalars(op->n_attrs);
  std::vector<bool> from_scalar(op->n_attrs, false);
  if (attrs.contains("lbopt_scalars")) {
    auto list = attrs.get<std::string_view>("lbopt_scalars");
    if (list.has_error()) return list.error();
    if (auto e = read_scalars(op, *list, args, next_arg, &scalars, &from_scalar); !e.success()) return e;
  } else if (args.size() > next_arg) {
    return ffi::Error::InvalidArgument(std::to_string(args.size() - next_arg) +
                                       " arguments follow the tensors, and no lbopt_scalars names them");
  }

  std::vector<lbopt_attr> values;
  std::vector<std::string> strings(op->n_attrs);
  for (size_t i = 0; i < op->n_attrs; ++i) {
    const lbopt_attr_arg& a = op->attrs[i];
    if (from_scalar[i]) {
      if (attrs.contains(a.name))
        return ffi::Error::InvalidArgument(std::string(a.name) + ": given as an attribute and in lbopt_scalars");
      values.push_back(scalars[i]);
      continue;
    }
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
