#include "train/setup.h"

#include "model/transformer_spec.h"
#include "pipeline/schedule.h"
#include "kernels/base/error.h"

namespace trident {

Communicator* shared_head_group(const ModelConfig& model, ParallelState& parallel) {
  const int tp = parallel.size(Axis::tp);
  const int holders = tp / transformer_spec(model).kv_shards(tp);
  parallel.set_tp_piece_holders(holders);
  return holders > 1 ? &parallel.group({MeshAxis::tp_piece}) : nullptr;
}

HybridGroups hybrid_groups(const Config& config, ParallelState& parallel) {
  const int size = config.parallel.shard_size;
  HybridGroups g;
  if (size == 0 || size == parallel.size(Axis::dp) || zero_stage(config, parallel.dims()) == 0) return g;
  g.shard = &parallel.group({MeshAxis::dp_shard});
  g.replica = &parallel.group({MeshAxis::dp_replica});
  return g;
}

// The axes ZeRO shards the tensors every dp x cp rank holds over.
AxisSet zero_axes(const HybridGroups& hybrid) {
  return hybrid.shard != nullptr ? AxisSet{MeshAxis::dp_shard} : kDataParallel;
}

namespace {

DataParallel make_data_parallel(const Config& config, ParallelState& parallel, kernels::Kernels& k,
                                const Transformer& model, const HybridGroups& hybrid) {
  const ParameterLayout& layout = model.layout();
  Communicator& shards = hybrid.shard != nullptr ? *hybrid.shard : parallel.data_parallel();
  const int zero = zero_stage(config, parallel.dims());
  // The tensors reduced over other ranks than dp x cp (an expert's: those holding it).
  std::vector<GradientRegion> regions;
  for (const ParameterLayout::DataRegion& r : layout.data_regions()) regions.push_back({r.ranges, &parallel.group(r.axes)});
  if (zero < 2)
    return DataParallel(shards, k, layout.total_floats(), config.parallel.bucket_mb, config.parallel.zero >= 1,
                        config.parallel.overlap, hybrid.replica, std::move(regions));
  GradientUnits units;
  units.units = layout.units();
  units.windowed = model.store().windowed();
  units.locate = [&model](size_t offset) { return model.store().gradient_location(offset); };
  units.accumulates = config.train.global_batch / parallel.size(Axis::dp) / config.train.micro_batch > 1;
  units.reduced_twice = model.store().unit_reduced_twice();
  return DataParallel(shards, k, layout.total_floats(), std::move(units), hybrid.replica, zero, std::move(regions));
}

// Where the optimizer's tensors have their other pieces (Muon gathers each matrix whole):
// ZeRO's shard group and each of its ranks' owned ranges, and the tp group. Without ZeRO
// the data-parallel ranks all own everything (alike owned ranges: each orthogonalizes its
// share of the matrices for all of them), but under expert parallelism, where they hold
// different experts.
OptimizerMesh optimizer_mesh(const DataParallel& data_parallel, Transformer& model) {
  OptimizerMesh mesh;
  Communicator& shards = data_parallel.shard_group();
  if (data_parallel.shards_optimizer_state()) {
    mesh.shards = &shards;
    for (int q = 0; q < shards.size(); q++)
      mesh.owned_by.push_back(DataParallel::sharded_ranges(data_parallel.buckets(), shards.size(), q));
  } else if (shards.size() > 1 && model.expert_parallel() == nullptr) {
    mesh.shards = &shards;
    mesh.owned_by.assign(shards.size(), data_parallel.owned());
  }
  Communicator* tp = model.tensor_parallel().communicator();
  if (tp != nullptr && tp->size() > 1) mesh.tp = tp;
  return mesh;
}

}  // namespace

int32_t document_end(const DataConfig& data) {
  if (!data.document_mask) return -1;
  require(data.eod_token >= 0, "data.document_mask needs an end-of-document token: the tokenizer (data.tokenizer) "
                               "has none; name it with data.eod_token");
  return data.eod_token;
}

TrainingSetup::TrainingSetup(const Config& config, ParallelState& parallel, kernels::Kernels& k)
    : local_batch(config.train.global_batch / parallel.size(Axis::dp)),
      stage(rank_stage(config, parallel.dims(), parallel.coords())),
      plan(plan_pipeline(config, parallel, local_batch, config.train.micro_batch)),
      shared_heads(shared_head_group(config.model, parallel)), hybrid(hybrid_groups(config, parallel)),
      model(config.model, k,
            {.micro_batch = stage.micro_batch,
             .tp = TensorParallel(parallel.tp(), stage.sequence_parallel),
             .buffer_multiple = stage.buffer_multiple,
             .stage = stage.stage,
             .slots = stage.slots,
             .chunk_slots = stage.chunk_slots,
             .recompute = stage.recompute,
             .recompute_layers = stage.recompute_layers,
             .recompute_method = stage.recompute_method,
             .split_backward = stage.split_backward,
             .zero = static_cast<ZeroStage>(stage.zero),
             .shard_group = hybrid.shard ? hybrid.shard : &parallel.data_parallel(),
             .region_groups = parallel.groups().group,
             .document_end = document_end(config.data),
             .context_parallel = parallel.size(Axis::cp) > 1 ? &parallel.cp() : nullptr,
             .expert_parallel = parallel.expert_parallel()}),
      data_parallel(make_data_parallel(config, parallel, k, model, hybrid)),
      optimizer(make_optimizer(config.train.optimizer, model.layout(),
                               {config.train.beta1, config.train.beta2, config.train.adam_eps, config.train.weight_decay},
                               k, data_parallel.owned(), optimizer_mesh(data_parallel, model))),
      runner(model, *optimizer, data_parallel, parallel.groups(), k, plan.links, zero_axes(hybrid)) {
  if (k.host_memory()) {
    data_parallel.set_max_in_flight(kMpiReductionsInFlight);
    data_parallel.set_max_window_reductions(kMpiWindowReductionsInFlight);
  }
}

ShardedState TrainingSetup::sharded_state() {
  const size_t n = model.layout().total_floats();
  std::vector<ShardedBuffer> state;
  for (size_t i = 0; i < optimizer->kind().state_names.size(); i++)
    state.push_back({optimizer->kind().state_names[i], [this, i, n](float* flat) { optimizer->state_to_host(i, flat, n); },
                     [this, i](const float* flat) { optimizer->state_from_host(i, flat); }});
  return {model.store().parameters(), optimizer->kind().name, std::move(state),
          [this](float* flat) { data_parallel.gather_host_buffer(flat); },
          [this](int steps) { optimizer->set_steps_taken(steps); },
          {"buffers", [this](float* flat) { model.buffers_to_host(flat); },
           [this](const float* flat) { model.buffers_from_host(flat); }}};
}

}  // namespace trident
