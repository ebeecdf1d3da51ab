// Compile-time lists of types (the optimizers, the state kinds) and the one way code reaches an entry from its
// run-time id: an entry's index in its list is its id.
#ifndef LBOPT_TYPE_LIST_H
#define LBOPT_TYPE_LIST_H
#include "hd.h"

namespace lbopt {

template <class... Ts>
struct TypeList {
  static constexpr int size = int(sizeof...(Ts));
};

template <int I, class List>
struct TypeAt;
template <class First, class... Rest>
struct TypeAt<0, TypeList<First, Rest...>> {
  using type = First;
};
template <int I, class First, class... Rest>
struct TypeAt<I, TypeList<First, Rest...>> : TypeAt<I - 1, TypeList<Rest...>> {};

// f(Entry{}) for the entry of List whose index is id; validation lets no other id through, and any other id gets
// the first entry. Host code passes host-only callables (the CUDA launcher), device code device ones: nvcc is told
// not to check which side f runs on.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class List, int I = 1, class F>
LBOPT_HD decltype(auto) with_entry(int id, F&& f) {
  if constexpr (I < List::size) {
    if (id == I) return f(typename TypeAt<I, List>::type{});
    return with_entry<List, I + 1>(id, static_cast<F&&>(f));
  } else {
    return f(typename TypeAt<0, List>::type{});
  }
}

}  // namespace lbopt
#endif  // LBOPT_TYPE_LIST_H
