// AliasOf: a tensor over part of another's storage that is not an autograd
// view of it. A .grad must be one: the optimizers' zero_grad detaches .grad
// in place, which a view refuses ("Can't detach views in-place").
#ifndef MUSTER_TRAINER_DDP_STORAGE_ALIAS_H_
#define MUSTER_TRAINER_DDP_STORAGE_ALIAS_H_

#include <ATen/ATen.h>
#include <c10/util/strides.h>

namespace muster {

// `sizes` elements of `flat` from element `offset`, contiguous, sharing its
// storage.
inline at::Tensor AliasOf(const at::Tensor& flat, int64_t offset, at::IntArrayRef sizes) {
  at::Tensor alias = at::empty({0}, flat.options());
  alias.set_(flat.storage(), flat.storage_offset() + offset, sizes,
             c10::contiguous_strides(sizes));
  return alias;
}

}  // namespace muster

#endif  // MUSTER_TRAINER_DDP_STORAGE_ALIAS_H_
