#include "plan/run_layout.h"

#include <algorithm>

#include "kernels/base/error.h"
#include "model/transformer_spec.h"
#include "pipeline/schedule.h"

namespace trident {

void resolve_for_world(Config& config, int world_size) {
  const TransformerSpec spec = transformer_spec(config.model);  // the family's own rules
  const std::vector<int> layers =
      stage_layer_counts(config.model.n_layer, config.parallel.pp, config.parallel.pp_layers, config.parallel.vpp);
  // Partial recomputation counts layers per model chunk (a smaller chunk recomputes all of its own).
  const int chunk_layers = *std::max_element(layers.begin(), layers.end()) / config.parallel.vpp;
  require(config.train.recompute_layers <= chunk_layers,
          "train.recompute_layers (" + std::to_string(config.train.recompute_layers) + ") exceeds the layers of a " +
              (config.parallel.vpp > 1 ? "model chunk" : "pipeline stage") + " (" + std::to_string(chunk_layers) +
              ": model.n_layer " + std::to_string(config.model.n_layer) + " over parallel.pp " +
              std::to_string(config.parallel.pp) +
              (config.parallel.vpp > 1 ? " x parallel.vpp " + std::to_string(config.parallel.vpp) : std::string()) +
              "); 0 recomputes every layer");
  config.resolve_layout(world_size);
  check_tensor_parallel(spec, config.parallel.tp);
  const ParallelConfig& p = config.parallel;
  require(p.shard_size == 0 || config.parallel.dp % p.shard_size == 0,
          "parallel.shard_size (" + std::to_string(p.shard_size) + ") must divide dp (" +
              std::to_string(config.parallel.dp) + ")");
  require(p.ep == 1 || spec.n_experts > 0,
          "parallel.ep (" + std::to_string(p.ep) + ") needs a mixture of experts (model.family mixtral or qwen3_moe)");
  require(p.ep == 1 || spec.n_experts % p.ep == 0,
          "parallel.ep (" + std::to_string(p.ep) + ") must divide the experts (model.n_experts = " +
              std::to_string(spec.n_experts) + "): each ep rank holds the same number of them");
  require(config.model.seq_len % (2 * p.cp) == 0,
          "parallel.cp (" + std::to_string(p.cp) + ") needs model.seq_len (" + std::to_string(config.model.seq_len) +
              ") to be a multiple of 2 cp = " + std::to_string(2 * p.cp) + " (each sequence is cut into 2 cp chunks)");
  const int tokens = config.model.seq_len / p.cp;  // of a sequence, on each rank of its cp group
  require(!p.sequence_parallel || tokens % p.tp == 0,
          "parallel.sequence_parallel: model.seq_len (" + std::to_string(config.model.seq_len) + ")" +
              (p.cp > 1 ? " / parallel.cp (" + std::to_string(p.cp) + ")" : std::string()) +
              " must be a multiple of parallel.tp (" + std::to_string(p.tp) + "): each rank holds its share of the rows");
  require(p.cp == 1 || p.shard_size == 0,
          "parallel.shard_size (hybrid sharding) with parallel.cp > 1 is not supported: ZeRO shards over all of "
          "dp x cp; set parallel.shard_size=0");
}

int zero_stage(const Config& config, const ParallelDims& dims) {
  return dims.data_parallel_size() > 1 ? config.parallel.zero : 0;
}

RankStage rank_stage(const Config& config, const ParallelDims& d, const RankCoords& coords) {
  const ParallelConfig& p = config.parallel;
  RankStage s;
  const int pp = coords[Axis::pp], stages = d.size(Axis::pp);
  s.stage = stage_spec(config.model.n_layer, pp, stages, p.pp_layers, p.vpp);
  s.stage.ep = d.size(MeshAxis::ep);
  s.stage.ep_rank = d.group_rank(coords, {MeshAxis::ep});
  s.tp_rank = coords[Axis::tp];
  s.tp = d.size(Axis::tp);
  s.cp = d.size(Axis::cp);
  s.buffer_multiple = static_cast<size_t>(d.data_parallel_size());
  s.micro_batch = config.train.micro_batch;
  const ActivationSlots slots =
      activation_slots(p.schedule, pp, stages, config.train.accumulation_steps(d.size(Axis::dp)), p.vpp);
  s.slots = slots.slots;
  if (p.vpp > 1) s.chunk_slots = slots.chunk_slots;
  s.recompute = config.train.recompute;
  s.recompute_layers = config.train.recompute_layers;
  s.recompute_method = config.train.recompute_method;
  s.sequence_parallel = p.sequence_parallel && s.tp > 1;
  s.split_backward = p.schedule == Schedule::zb1;
  s.zero = zero_stage(config, d);
  s.stage.windowed_ends = s.zero == 3 && !(s.split_backward && s.recompute == Recompute::none);
  return s;
}

ParameterLayout RankStage::layout(const TransformerSpec& spec) const {
  return ParameterLayout(spec, tp_rank, tp, buffer_multiple, stage);
}

ActivationShape RankStage::activations(const TransformerSpec& spec, const kernels::Footprint& k) const {
  ActivationShape shape = activation_shape(spec, stage, micro_batch, slots, recompute, k, sequence_parallel ? tp : 1,
                                          split_backward, cp, chunk_slots);
  shape.recompute_layers = recompute_layers;
  shape.recompute_method = recompute_method;
  return shape;
}

}  // namespace trident
