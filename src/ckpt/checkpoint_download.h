// Resuming from S3 (checkpoint.upload) when checkpoint.dir holds nothing as new: a job on
// a new cluster, a node with an empty NVMe. Every node leader downloads the node files
// its node's ranks read (files_needed: a rank under the saving layout reads its own
// shards' file alone, a resharding rank every file of the tensors it reshards) into
// checkpoint.dir/step_NNNNNNNN/, ranged GETs in parallel, each checked against the
// manifest's size and CRC-32. A checkpoint with a file refused (missing, truncated,
// corrupted) gives way to the complete one before it, as on disk.
#pragma once

#include <optional>
#include <string>

#include "ckpt/checkpoint_format.h"
#include "ckpt/remote_checkpoints.h"
#include "parallel/parallel_state.h"

namespace trident {

struct StagedCheckpoint {
  Manifest manifest;          // its dir: the local step directory holding the files needed here
  std::string manifest_text;
  double bytes = 0, seconds = 0;  // downloaded over all nodes; the slowest node's time
  int files = 0;                  // downloaded over all nodes
};

// Collective. The newest complete checkpoint in S3 with a step above `local_step` (-1:
// none on disk), staged for loading under `layout`; nullopt if S3 holds none. `remote`:
// rank 0's and the node leaders' (nullptr elsewhere). An agreed UsageError if S3 has
// checkpoints and none can be loaded.
std::optional<StagedCheckpoint> stage_from_s3(const CheckpointConfig& config, ParallelState& parallel,
                                              RemoteCheckpoints* remote, const ParameterLayout& layout,
                                              int local_step);

}  // namespace trident
