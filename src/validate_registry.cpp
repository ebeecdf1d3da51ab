// The checks of the operator registry's arguments (lbopt_op_invoke): the operator, its tensors by the schema's
// roles, its attributes by name and type, and the string and output forms the conversion and layout operators
// take. The tensors themselves are checked by the typed entry points the registry forwards to.
#include <stdio.h>
#include <string.h>

#include "../kernels/quant.h"
#include "error.h"
#include "validate.h"

namespace lbopt {
namespace {

const char* type_name(int32_t t) {
  static const char* names[] = {"DOUBLE", "INT64", "BOOL", "STRING"};
  return t >= 0 && t < 4 ? names[t] : "unknown";
}

}  // namespace

lbopt_status validate_op(const lbopt_op_info* op, const lbopt_op_info* ops, size_t n_ops, size_t* id) {
  if (!op) return fail(LBOPT_ERR_NULL_POINTER, "op: NULL");
  // By address, not by pointer arithmetic, which is undefined for a pointer into some other object.
  const uintptr_t base = uintptr_t(ops), at = uintptr_t(op);
  if (at < base || at - base >= n_ops * sizeof *op || (at - base) % sizeof *op != 0)
    return fail(LBOPT_ERR_INVALID_VALUE, "op: not an operator of this library");
  *id = (at - base) / sizeof *op;
  return LBOPT_OK;
}

lbopt_status validate_op_tensors(const lbopt_op_info& op, const DLTensor* const* tensors, size_t n_tensors) {
  if (n_tensors != op.n_tensors)
    return fail(LBOPT_ERR_INVALID_VALUE, "n_tensors = %zu, %s takes %zu", n_tensors, op.name, op.n_tensors);
  if (!tensors) return fail(LBOPT_ERR_NULL_POINTER, "tensors: NULL");
  for (size_t i = 0; i < n_tensors; ++i)
    if (!tensors[i] && !op.tensors[i].optional)
      return fail(LBOPT_ERR_NULL_POINTER, "tensors[%zu] (%s): NULL, and %s requires it", i, op.tensors[i].name,
                  op.name);
  return LBOPT_OK;
}

lbopt_status validate_op_attrs(const lbopt_op_info& op, const lbopt_attr* attrs, size_t n_attrs, lbopt_attr* out,
                               size_t out_size) {
  constexpr size_t kMaxSeen = 64;
  if (op.n_attrs > out_size || op.n_attrs > kMaxSeen)
    return fail(LBOPT_ERR_INTERNAL, "%s has more attributes than the registry holds", op.name);
  bool seen[kMaxSeen] = {};
  if (n_attrs && !attrs) return fail(LBOPT_ERR_NULL_POINTER, "attrs: NULL with n_attrs = %zu", n_attrs);
  for (size_t i = 0; i < n_attrs; ++i) {
    const lbopt_attr& a = attrs[i];
    if (!a.name) return fail(LBOPT_ERR_NULL_POINTER, "attrs[%zu].name: NULL", i);
    size_t k = 0;
    while (k < op.n_attrs && strcmp(op.attrs[k].name, a.name) != 0) ++k;
    if (k == op.n_attrs)
      return fail(LBOPT_ERR_INVALID_VALUE, "attrs[%zu]: unknown attribute '%s' for %s", i, a.name, op.name);
    if (seen[k]) return fail(LBOPT_ERR_INVALID_VALUE, "attrs[%zu]: attribute '%s' given twice", i, a.name);
    if (a.type != op.attrs[k].type)
      return fail(LBOPT_ERR_DTYPE, "attrs[%zu] '%s': type %s, %s takes %s", i, a.name, type_name(a.type), op.name,
                  type_name(op.attrs[k].type));
    if (a.type == LBOPT_ATTR_STRING && !a.s)
      return fail(LBOPT_ERR_NULL_POINTER, "attrs[%zu] '%s': NULL string", i, a.name);
    if (a.type == LBOPT_ATTR_BOOL && a.i != 0 && a.i != 1)
      return fail(LBOPT_ERR_INVALID_VALUE, "attrs[%zu] '%s': bool %lld is not 0 or 1", i, a.name, (long long)a.i);
    seen[k] = true;
    out[k] = a;
  }
  for (size_t k = 0; k < op.n_attrs; ++k) {
    if (seen[k]) continue;
    const lbopt_attr_arg& s = op.attrs[k];
    if (s.required) return fail(LBOPT_ERR_INVALID_VALUE, "attribute '%s' of %s is required", s.name, op.name);
    out[k] = lbopt_attr{s.name, s.type, s.default_double, s.default_int, s.default_string};
  }
  return LBOPT_OK;
}

lbopt_status validate_kind_name(const char* s, lbopt_state_kind* out) {
  char names[64] = "";
  for (int k = 0; k < kNumStateKinds; ++k) {
    if (strcmp(s, state_kind_name(k)) == 0) {
      *out = lbopt_state_kind(k);
      return LBOPT_OK;
    }
    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", state_kind_name(k));
  }
  return fail(LBOPT_ERR_INVALID_VALUE, "attribute 'kind' = '%s' is not one of %s", s, names);
}

lbopt_status validate_moment_name(const char* s, lbopt_moment* out) {
  if (strcmp(s, "m") == 0) *out = LBOPT_MOMENT_FIRST;
  else if (strcmp(s, "v") == 0) *out = LBOPT_MOMENT_SECOND;
  else if (strcmp(s, "v_signed") == 0) *out = LBOPT_MOMENT_SECOND_SIGNED;
  else return fail(LBOPT_ERR_INVALID_VALUE, "attribute 'moment' = '%s' is not 'm', 'v' or 'v_signed'", s);
  return LBOPT_OK;
}

lbopt_status validate_layout_out(const DLTensor* out, int64_t** values) {
  const uintptr_t addr = uintptr_t(out->data) + out->byte_offset;
  if (out->device.device_type != kDLCPU || out->dtype.code != kDLInt || out->dtype.bits != 64 ||
      out->dtype.lanes != 1 || out->ndim != 1 || !out->shape || out->shape[0] != 4 || !out->data ||
      (out->strides && out->strides[0] != 1) || addr < uintptr_t(out->data) || addr % 8 != 0)
    return fail(LBOPT_ERR_SHAPE, "tensors[0] (out): must be a compact, aligned int64 [4] CPU tensor");
  *values = reinterpret_cast<int64_t*>(addr);
  return LBOPT_OK;
}

}  // namespace lbopt
