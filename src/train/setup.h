// What train, verify and the tests build the same way (the config resolved for the world
// by plan/run_layout.h): one rank's model stage, data parallelism, optimizer and step runner.
#pragma once

#include <memory>

#include "ckpt/sharded_state.h"
#include "config/config.h"
#include "kernels/kernels.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/parallel_state.h"
#include "pipeline/pipeline_plan.h"
#include "plan/run_layout.h"
#include "train/step_runner.h"

namespace trident {

// The group of tp ranks that hold the same key/value head (when tp exceeds the model's
// key/value heads: the mesh's tp_piece axis, which this sets); null when no rank shares
// one. Collective.
Communicator* shared_head_group(const ModelConfig& model, ParallelState& parallel);

// Hybrid sharding's groups (parallel.shard_size below dp): the shard group of
// consecutive dp ranks and the replicas across them (dp_shard, dp_replica); both null
// otherwise. Collective.
struct HybridGroups {
  Communicator* shard = nullptr;
  Communicator* replica = nullptr;
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
  const RankStage stage;  // what this rank's model stage holds (plan/run_layout.h)
  const PipelinePlan plan;
  Communicator* const shared_heads;  // ranks sharing a key/value head (tp > n_kv_head), or null
  const HybridGroups hybrid;  // shard and replica groups of hybrid sharding, if any
  Transformer model;
  DataParallel data_parallel;
  const std::unique_ptr<Optimizer> optimizer;  // train.optimizer
  StepRunner runner;
};

}  // namespace trident
