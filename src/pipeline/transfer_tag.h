// The message tag of a point-to-point transfer between pipeline stages. The ranks of a
// stage pair may have several transfers of one direction in flight (1F1B's warmup, and
// with several model chunks per rank, one per chunk), so the tag names the micro-batch,
// the chunk it goes into on the receiving rank, and the direction.
#pragma once

namespace trident {

enum class Transfer { activation, gradient };

// Distinct for every (micro_batch, chunk < chunks, direction) when every rank holds
// `chunks` chunks; with one chunk: 2 * micro_batch (+1 for a gradient).
inline int transfer_tag(Transfer direction, int micro_batch, int chunk, int chunks) {
  return 2 * (micro_batch * chunks + chunk) + (direction == Transfer::gradient ? 1 : 0);
}

}  // namespace trident
