#include "plan/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "ckpt/checkpoint.h"
#include "storage/s3_client.h"
#include "model/activations.h"
#include "model/layers/moe.h"
#include "model/transformer.h"
#include "model/transformer_spec.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel.h"
#include "parallel/param_grad_store.h"
#include "pipeline/schedule.h"
#include "plan/run_layout.h"

namespace trident {

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

size_t RankMemoryPlan::device_bytes() const {
  size_t sum = 0;
  for (const MemoryPart& p : parts) sum += p.host ? 0 : p.bytes;
  return sum;
}

size_t RankMemoryPlan::host_bytes() const {
  size_t sum = 0;
  for (const MemoryPart& p : parts) sum += p.host ? p.bytes : 0;
  return sum;
}

size_t RankMemoryPlan::of(const std::string& kind) const {
  size_t sum = 0;
  for (const MemoryPart& p : parts) sum += p.kind == kind ? p.bytes : 0;
  return sum;
}

std::string RankMemoryPlan::describe() const {
  std::string text;
  for (const MemoryPart& p : parts) {
    if (p.bytes == 0) continue;
    char line[256];
    std::snprintf(line, sizeof line, "%s%s %.3f GiB (%s)", text.empty() ? "" : ", ", p.kind.c_str(),
                  gib(static_cast<double>(p.bytes)), p.detail.c_str());
    text += line;
  }
  return text;
}

namespace {

ParameterLayout rank_layout(const Config& config, const RankCoords& c) {
  return rank_stage(config, config.dims(), c).layout(transformer_spec(config.model));
}

// What DeviceBuffer takes for `bytes` (whole floats).
size_t buffer_bytes(size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float) * sizeof(float); }

}  // namespace

size_t checkpoint_piece_bytes(const Config& config, const RankCoords& coords) {
  if (config.checkpoint.dir.empty()) return 0;
  return Checkpointer::piece_bytes(rank_layout(config, coords), CheckpointWriter{config.dims(), coords},
                                   optimizer_kind(config.train.optimizer).state_names);
}

RankMemoryPlan plan_rank_memory(const Config& config, const RankCoords& coords, const kernels::Footprint& k,
                                bool node_leader, size_t node_leader_receives, bool device_only,
                                bool partner_copies) {
  ParallelDims d = config.dims();
  const RankStage stage = rank_stage(config, d, coords);  // what TrainingSetup builds there
  const ParameterLayout layout = stage.layout(transformer_spec(config.model));
  const TransformerSpec& spec = layout.spec();
  d.set_tp_piece_holders(d.size(Axis::tp) / spec.kv_shards(d.size(Axis::tp)));  // as setup does
  const size_t n = layout.total_floats(), f32 = sizeof(float);
  RankMemoryPlan plan;
  plan.coords = coords;
  const auto add = [&plan](const std::string& kind, const std::string& detail, size_t bytes, bool host = false) {
    plan.parts.push_back({kind, detail, bytes, host});
  };
  char detail[256];

  const int zero = stage.zero;
  const CheckpointWriter writer{d, coords};  // of the checkpoint's pieces
  // ZeRO-3 gathers the blocks into two windows (as ZeRO-2's gradients), and the embeddings
  // and head too where they fit one; what does not is kept gathered
  // (parallel/param_grad_store.h). In bf16 it gathers the compute copy only (the fp32
  // values are in the shard).
  const ZeroStage zero_stage = static_cast<ZeroStage>(zero);
  const ActivationShape shape = stage.activations(spec, k);
  const bool defers = shape.deferred_weight_gradients;
  const std::vector<bool> windowed = ParamGradStore::windowed_units(layout, zero_stage, defers);
  // What is kept whole and what the windows hold, in words: "final norm kept, embeddings
  // (the tied head's table) and blocks in 2 windows".
  std::vector<std::string> kept_names, windowed_names;
  const bool tied = layout.head_reads_embedding_unit();
  if (const int u = layout.embedding_unit(); u >= 0)
    (windowed[u] ? windowed_names : kept_names).push_back(tied ? "embeddings (the tied head's table)" : "embeddings");
  windowed_names.push_back("blocks");
  if (const int u = layout.head_unit(); u >= 0)
    (windowed[u] ? windowed_names : kept_names).push_back(tied ? "final norm" : "final norm and head");
  const auto listed = [](const std::vector<std::string>& names) {
    std::string s;
    for (size_t i = 0; i < names.size(); i++) s += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
    return s;
  };
  const std::string residence = (kept_names.empty() ? "" : listed(kept_names) + " kept, ") + listed(windowed_names) +
                                (layout.layers() < 2 ? " in 1 window" : " in 2 windows");
  const size_t compute_floats = ParamGradStore::compute_weight_floats_for(layout, zero_stage, defers);
  add("parameters", zero == 3 ? "fp32 gathered; ZeRO-3: " + residence : "fp32",
      ParamGradStore::parameter_floats_for(layout, zero_stage, k.precision(), defers) * f32);
  if (k.precision() == kernels::Precision::bf16)
    add("compute copy", zero == 3 ? "bf16 weights gathered: " + residence : "bf16 weights",
        buffer_bytes(k.activation_bytes(compute_floats)));
  if (!layout.buffers().empty()) {  // the declared buffers (StateKind::buffer), whole on every rank holding them
    std::string names;
    for (const ParameterTensor& b : layout.buffers())
      if (names.find(b.name.substr(b.name.rfind('.') + 1)) == std::string::npos)
        names += (names.empty() ? "" : ", ") + b.name.substr(b.name.rfind('.') + 1);
    add("buffers", "fp32, not optimized: " + std::to_string(layout.buffers().size()) + " (" + names + ")",
        layout.buffer_floats() * f32);
  }
  const size_t windowed_floats = ParamGradStore::gradient_floats_for(layout, zero_stage, defers);
  add("gradients", zero >= 2 ? "fp32; " + residence : "fp32", windowed_floats * f32);
  // The optimizer's state over the ranges this rank updates (ZeRO: its block of each
  // bucket; ZeRO-2's buckets are the layout's units).
  // Hybrid sharding: over groups of shard_size dp ranks.
  const int shards = config.parallel.shard_size > 0 ? config.parallel.shard_size : d.data_parallel_size();
  // Each bucket's block over the group ZeRO shards it over: dp x cp's (hybrid: the shard
  // group's), or its region's (model/parameters.h data_regions).
  const AxisSet zero_axes = shards < d.data_parallel_size() ? AxisSet{MeshAxis::dp_shard} : kDataParallel;
  std::map<AxisSet, std::pair<int, int>> shard_place;  // by axes: the group's size, this rank's place
  const auto sharded_over = [&](const FlatRange& b) {
    const AxisSet region = layout.data_axes_of(b);
    const AxisSet axes = region == kDataParallel ? zero_axes : region;
    auto [at, fresh] = shard_place.try_emplace(axes);
    if (fresh) at->second = {d.size(axes), d.group_rank(coords, axes)};
    return at->second;
  };
  std::vector<FlatRange> owned;
  if (zero > 0)
    for (const FlatRange& b : split_at(zero >= 2 ? layout.units()
                                                 : DataParallel::bucket_ranges(n, config.parallel.bucket_mb, shards),
                                       layout.region_ranges())) {
      const auto [ranks, rank] = sharded_over(b);
      owned.push_back(DataParallel::sharded_ranges({b}, ranks, rank)[0]);
    }
  std::string region_shares;
  for (const ParameterLayout::DataRegion& r : layout.data_regions())
    region_shares += ", over " + r.axes.name() + " 1/" + std::to_string(d.size(r.axes));
  const OptimizerKind& optimizer = optimizer_kind(config.train.optimizer);
  std::string state;
  for (const std::string& name : optimizer.state_names) state += (state.empty() ? " " : ", ") + name;
  add("optimizer state", optimizer.name + state + (zero > 0 ? "; 1/" + std::to_string(shards) + region_shares : std::string()),
      optimizer.state_floats_for(layout, owned) * f32);
  if (optimizer.work_floats_for)
    add("optimizer work", optimizer.name + "'s buffers of a step", optimizer.work_floats_for(layout, owned) * f32);
  if (zero > 0) {
    size_t shard = 0, window_shard = 0;
    for (const FlatRange& r : owned) shard += r.size();
    add("gradient shard", "ZeRO reduce-scatter output", shard * f32);
    if (zero == 3) add("parameter shard", "ZeRO-3: fp32 master, 1/" + std::to_string(shards) + " of each unit", shard * f32);
    for (size_t u = 0; u < windowed.size(); u++) {  // a windowed unit's blocks of its pieces (owned is in order)
      if (!windowed[u]) continue;
      const FlatRange& unit = layout.units()[u];
      size_t floats = 0;
      for (const FlatRange& r : owned)
        if (r.begin >= unit.begin && r.end <= unit.end) floats += r.size();
      window_shard = std::max(window_shard, floats);
    }
    const int windows = std::min(layout.layers(), 2);
    // A tied table in the windows is reduced twice per micro-batch: one buffer for its second sum.
    const bool twice = layout.head_reads_embedding_unit() && windowed[layout.embedding_unit()];
    if (zero >= 2 && config.train.global_batch / d.size(Axis::dp) / config.train.micro_batch > 1)
      add("accumulation buffers", "ZeRO-2/3: a window's shard, per window", windows * window_shard * f32);
    else if (zero == 3 && twice)
      add("accumulation buffers", "ZeRO-3: the tied table's second sum, a window's shard", window_shard * f32);
  }

  // The activations the stage's layers declare, measured as the model lays them out.
  const int micro_batch = stage.micro_batch;
  const StageActivations a = measure_activations(spec, stage.stage, stage.tp_rank, stage.tp, shape);
  const double MiB = 1 << 20;
  if (stage.chunk_slots.empty())
    std::snprintf(detail, sizeof detail, "%d in flight x %.1f MiB, micro-batch %d, recompute %s", stage.slots,
                  static_cast<double>(a.bytes.per_slot) / MiB, micro_batch, config.train.recompute_description().c_str());
  else  // interleaved: per (micro-batch, chunk), the embedding's and head's apart
    std::snprintf(detail, sizeof detail,
                  "%d (micro-batch, chunk) in flight x %.1f MiB + embedding/head %.1f MiB, micro-batch %d, "
                  "recompute %s",
                  stage.slots, static_cast<double>(a.bytes.per_slot) / MiB,
                  static_cast<double>(a.bytes.chunk_own) / MiB, micro_batch, config.train.recompute_description().c_str());
  add("activations", detail + dropless_rows_held(spec, d.size(MeshAxis::ep), config.model), a.bytes.slots);
  add("recompute set", "one block's, shared", a.bytes.recompute);
  add("backward scratch", "shared by the layers", a.bytes.backward);
  if (spec.positions == PositionKind::rotary) add("rope table", "cos, sin", rope_table_floats(spec) * f32);
  add("workspace", "the kernels' own",
      k.workspace_bytes(micro_batch * shape.seq_len, spec.d_model, a.widest_output, micro_batch, shape.seq_len,
                        spec.n_head / d.size(Axis::tp)));
  if (const size_t copies = k.gemm_copy_bytes(a.gemm_operands); copies > 0)
    add("bf16 GEMM inputs", "the largest GEMM's inputs in bf16, for oneDNN", copies);

  // Communication: Open MPI's non-blocking reductions (libnbc, 4.1) take temporaries:
  // an all-reduce one of its message's size, a reduce-scatter one (2 ranks) or two (more),
  // an in-place all-gather none (measured, benchmarks/RESULTS.md); at most
  // kMpiReductionsInFlight gradient buckets are in flight (ZeRO-2/3: the kept units at the
  // end; of the windowed units kMpiWindowReductionsInFlight). NCCL keeps buffers of its own per communicator
  // (NCCL_BUFFSIZE 4 MiB per channel and direction; 64 MiB assumed).
  if (k.host_memory()) {
    const auto largest_sum = [](std::vector<size_t> sizes, size_t count) {
      std::sort(sizes.rbegin(), sizes.rend());
      size_t sum = 0;
      for (size_t i = 0; i < std::min(count, sizes.size()); i++) sum += sizes[i];
      return sum;
    };
    // A bucket's reduction is over its group: a region's pieces are buckets of their own,
    // reduced over the region's ranks (not at all where one rank holds it).
    const auto reduced_bytes = [&](const FlatRange& range, std::vector<size_t>& sizes) {
      for (const FlatRange& b : split_at({range}, layout.region_ranges()))
        if (d.size(layout.data_axes_of(b)) > 1) sizes.push_back(b.size() * f32);
    };
    size_t in_flight = 0;
    if (d.data_parallel_size() > 1) {
      std::vector<size_t> windows, kept, buckets;
      for (size_t u = 0; u < layout.units().size(); u++) reduced_bytes(layout.units()[u], windowed[u] ? windows : kept);
      for (const FlatRange& b : DataParallel::bucket_ranges(n, config.parallel.bucket_mb, zero > 0 ? shards : d.data_parallel_size()))
        reduced_bytes(b, buckets);
      in_flight = zero >= 2 ? std::max(largest_sum(windows, kMpiWindowReductionsInFlight),
                                       largest_sum(kept, kMpiReductionsInFlight))
                            : largest_sum(buckets, kMpiReductionsInFlight);
      if (zero > 0 && shards > 2) in_flight *= 2;  // reduce-scatters
      if (zero > 0 && shards < d.data_parallel_size()) in_flight += in_flight / shards;  // hybrid: the blocks' all-reduces
    }
    // The tied embedding's sum between the pipeline's ends, a piece at a time (one tensor
    // after another), while the other buckets' reductions are in flight.
    if (d.size(Axis::pp) > 1) {
      size_t piece = 0;
      for (const ParameterTensor& t : layout.tensors())
        if (t.placement.summed_over.has(MeshAxis::pp_ends)) piece = std::max(piece, std::min(t.stored, kReductionPieceFloats));
      in_flight += piece * f32;
    }
    const size_t activations_all_rows = k.activation_bytes(static_cast<size_t>(micro_batch) * shape.seq_len * spec.d_model);
    const bool scatters = config.parallel.sequence_parallel && d.size(Axis::tp) > 2;
    if (d.size(Axis::tp) > 1) in_flight = std::max(in_flight, activations_all_rows * (scatters ? 2 : 1));
    add("communication", "estimate: MPI's temporaries for the reductions in flight", in_flight);
  } else {
    // The NCCL communicators setup makes, one per distinct set of ranks of more than one
    // (parallel/parallel_state.h): the grid's axes (pp three: collectives and one per
    // direction), dp x cp, and those the placements and sharding name.
    std::set<AxisSet> groups;
    for (Axis a : kAxes) groups.insert(d.normalized(AxisSet{mesh_axis(a)}));
    groups.insert(d.normalized(kDataParallel));
    for (const ParameterTensor& t : layout.tensors()) {
      groups.insert(d.normalized(t.placement.model_sums()));
      groups.insert(d.normalized(t.placement.data_axes()));
      groups.insert(d.normalized(t.placement.sharded_over));
    }
    if (zero > 0 && shards < d.data_parallel_size()) {
      groups.insert(d.normalized({MeshAxis::dp_shard}));
      groups.insert(d.normalized({MeshAxis::dp_replica}));
    }
    groups.erase(AxisSet{});
    const int communicators = static_cast<int>(groups.size()) + 2 * (d.size(Axis::pp) > 1);
    add("communication", "estimate: NCCL's buffers, 64 MiB per communicator",
        static_cast<size_t>(communicators) * (64u << 20));
    // A NCCL communicator stages host buffers (the checkpoint's optimizer state) in device memory.
    if (zero > 0 && !config.checkpoint.dir.empty()) {
      size_t largest = 0;
      for (const FlatRange& b : zero >= 2 ? layout.units() : DataParallel::bucket_ranges(n, config.parallel.bucket_mb, shards))
        largest = std::max(largest, b.size());
      add("host staging", "NCCL's copy of one bucket of the checkpoint's optimizer state", largest * f32);
    }
  }

  if (device_only) return plan;
  if (!k.host_memory()) {  // initialization writes each tensor's shard through one host buffer
    size_t largest = 0;
    for (const ParameterTensor& t : layout.tensors()) largest = std::max(largest, t.stored);
    add("init staging", "host copy of the largest shard", largest * f32, true);
  }
  if (!config.checkpoint.dir.empty()) {
    add("checkpoint staging", "host copy of parameters and optimizer state",
        Checkpointer::staging_bytes(layout, optimizer.state_names), true);
    const bool writes = std::any_of(layout.tensors().begin(), layout.tensors().end(),
                                    [&](const ParameterTensor& t) { return writer.writes(t.placement); });
    add("checkpoint pieces", writes ? "handed to the node leader" : "none: another replica writes",
        Checkpointer::piece_bytes(layout, writer, optimizer.state_names), true);
    if (node_leader_receives > 0) add("node's pieces", "the node leader's", node_leader_receives, true);
    if (config.checkpoint.memory_every_steps > 0) {  // ckpt/memory_tier.h
      const size_t snapshot = Checkpointer::staging_bytes(layout, optimizer.state_names);
      if (partner_copies) {
        add("memory tier", "its snapshot on the way to the partner node, the partner's on the way here",
            2 * snapshot, true);
        add("memory tier files", "in checkpoint.memory_dir: three snapshots of its state and three of its partner's",
            6 * snapshot, true);
      } else {
        add("memory tier", "its snapshot", snapshot, true);
        add("memory tier files", "in checkpoint.memory_dir: three snapshots of its state", 3 * snapshot, true);
      }
    }
    if (node_leader)
      add("checkpoint writer", "copy of one piece, CRC buffer", Checkpointer::leader_buffer_bytes(layout), true);
    if (node_leader && !config.checkpoint.upload.empty()) {
      // The node file is about the node's pieces; its upload holds a part per transfer in flight.
      S3Settings s3;  // the sizes alone (s3_settings would look for a region, maybe over the network)
      s3.part_bytes = static_cast<size_t>(config.checkpoint.s3_part_mb) << 20;
      s3.parallel = config.checkpoint.s3_parallel;
      const uint64_t file = Checkpointer::piece_bytes(layout, writer, optimizer.state_names) + node_leader_receives;
      add("S3 upload", "estimate: " + std::to_string(s3.parallel) + " parts in flight of the node file",
          s3_upload_buffer_bytes(file, s3), true);
    }
  }
  return plan;
}

std::string beyond_plan(const RankMemoryPlan& plan, size_t planned_bytes, size_t taken,
                        const std::vector<MemoryPart>& beyond) {
  const double planned = static_cast<double>(planned_bytes), MiB = 1 << 20;
  if (planned <= 0 || static_cast<double>(taken) <= planned * (1 + kMemoryOverPlanWarning)) return "";
  char line[512];
  std::snprintf(line, sizeof line, "took %.1f MiB, %.1f%% of its memory plan (%.1f MiB); beyond it:",
                static_cast<double>(taken) / MiB, 100.0 * static_cast<double>(taken) / planned, planned / MiB);
  std::string text = line;
  size_t explained = 0;
  for (const MemoryPart& p : beyond) {
    if (p.bytes == 0) continue;
    std::snprintf(line, sizeof line, " %s +%.1f MiB over the plan's %.1f MiB (%s);", p.kind.c_str(),
                  static_cast<double>(p.bytes) / MiB, static_cast<double>(plan.of(p.kind)) / MiB, p.detail.c_str());
    text += line;
    explained += p.bytes;
  }
  const double rest = static_cast<double>(taken) - planned - static_cast<double>(explained);
  std::snprintf(line, sizeof line, " %.1f MiB in no part of the plan (what the kernels, MPI and the heap keep unasked)",
                std::max(rest, 0.0) / MiB);
  return text + line;
}

RankMemoryPlan busiest_rank_plan(const Config& config, const kernels::Footprint& k) {
  const ParallelDims d = config.dims();
  RankMemoryPlan busiest;
  // Every (tp, pp) position on dp rank 0 (it writes checkpoints; ZeRO shards differ by a block at most).
  for (int pp = 0; pp < d.size(Axis::pp); pp++)
    for (int tp = 0; tp < d.size(Axis::tp); tp++) {
      RankMemoryPlan p = plan_rank_memory(config, RankCoords().with(Axis::tp, tp).with(Axis::pp, pp), k);
      if (busiest.parts.empty() || p.total_bytes() > busiest.total_bytes()) busiest = std::move(p);
    }
  return busiest;
}

}  // namespace trident
