// What train, verify and the tests build the same way: the run's config completed for
// the world, and one rank's model stage, data parallelism, optimizer and step runner.
#pragma once

#include <memory>

#include "ckpt/sharded_state.h"
#include "config/config.h"
#include "kernels/kernels.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/parallel_state.h"
#include "pipeline/pipeline_plan.h"
#include "train/step_runner.h"

namespace trident {

// Completes a parsed config for `world_size` ranks (dp, micro_batch) and makes every
// check that needs the model's family or the pipeline: the family's own rules, tp
// against heads, key/value heads and the MLP width, the stage split, the schedule.
// UsageError naming the keys; before any communication, so every rank agrees.
void resolve_for_world(Config& config, int world_size);

// The group of tp ranks that hold the same key/value head (when tp exceeds the model's
// key/value heads), for TensorParallel; null when no rank shares one. Collective.
std::unique_ptr<Communicator> shared_head_group(const ModelConfig& model, ParallelState& parallel);

// Gradient-bucket reductions in flight at once on the CPU backend (MPI): each holds a
// temporary of its size in Open MPI (DataParallel::set_max_in_flight).
constexpr size_t kMpiReductionsInFlight = 2;

// The ZeRO stage that applies: parallel.zero, or 0 with one dp rank (nothing to shard).
int zero_stage(const Config& config, const ParallelDims& dims);

// Hybrid sharding's groups (parallel.shard_size below dp): the shard group of
// consecutive dp ranks and the replicas across them; both null otherwise. Collective.
struct HybridGroups {
  std::unique_ptr<Communicator> shard, replica;
};
HybridGroups hybrid_groups(const Config& config, ParallelState& parallel);

// The end-of-document id of document masking (model/document_mask.h), -1 without it;
// UsageError when data.document_mask has no token (data.eod_token, resolved from the
// tokenizer by resolve_eod_token, data/tokenizer.h).
int32_t document_end(const DataConfig& data);

// One rank's share of the training: built from the config and the grid, every buffer
// allocated here, once. The parameters are not initialized.
class TrainingSetup {
 public:
  TrainingSetup(const Config& config, ParallelState& parallel, kernels::Kernels& k);
  TrainingSetup(const TrainingSetup&) = delete;
  TrainingSetup& operator=(const TrainingSetup&) = delete;

  // The named, sharded views of the training state that checkpoints save and restore:
  // the model's parameters, the optimizer's moments and step count, ZeRO's shards
  // assembled by data parallelism.
  ShardedState sharded_state();

  const int local_batch;  // sequences of each global batch on this dp rank
  const PipelinePlan plan;
  const std::unique_ptr<Communicator> shared_heads;  // ranks sharing a key/value head (tp > n_kv_head)
  const HybridGroups hybrid;  // shard and replica groups of hybrid sharding, if any
  Transformer model;
  DataParallel data_parallel;
  AdamW optimizer;
  StepRunner runner;
};

}  // namespace trident
