#include "model/layers/sequence_regions.h"

namespace trident {

const kernels::Act* SequenceRegions::gathered_rows(const Act* mine, int B) {
  if (!tp_.sequence_parallel()) return mine;
  const size_t block = static_cast<size_t>(rows(B)) * C_;
  k_.copy_on_device(kernels::offset(gathered, tp_.rank() * block, type_), mine, k_.activation_bytes(block));
  tp_.gather_sequence(all_rows(gathered, B));
  return gathered;
}

void SequenceRegions::reduce_rows(Act* partial, Act* mine, int B) {
  if (tp_.sequence_parallel()) tp_.scatter_sequence(all_rows(partial, B), rows_of(mine, B));
  else tp_.reduce_from_region(all_rows(mine, B));
}

const kernels::Act* SequenceRegions::reduce_gradient_rows(Act* partial, int B) {
  if (!tp_.sequence_parallel()) {
    tp_.reduce_gradient_into_region(all_rows(partial, B));
    return partial;
  }
  tp_.scatter_sequence(all_rows(partial, B), rows_of(reduced, B));
  return reduced;
}

}  // namespace trident
