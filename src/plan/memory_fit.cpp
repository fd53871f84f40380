#include "plan/memory_fit.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "parallel/agreement.h"
#include "kernels/base/error.h"
#include "kernels/base/memory.h"
#include "plan/run_layout.h"

namespace trident {

namespace {

// What the ranks of one memory need together, and what that memory has free.
struct PoolDemand {
  std::string name;
  double need = 0, free = 0;
  int ranks = 0;
  bool fits() const { return need <= kUsableFraction * free; }
};

std::string gib_text(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", gib(bytes));
  return text;
}

// The plan's largest parts, largest first: "optimizer state 12.00 GiB, parameters 6.00 GiB, ...".
std::string largest_parts(const RankMemoryPlan& plan, size_t count) {
  std::vector<MemoryPart> parts = plan.parts;
  std::sort(parts.begin(), parts.end(), [](const MemoryPart& a, const MemoryPart& b) { return a.bytes > b.bytes; });
  std::string text;
  for (size_t i = 0; i < std::min(count, parts.size()) && parts[i].bytes > 0; i++)
    text += (i ? ", " : "") + parts[i].kind + " " + gib_text(static_cast<double>(parts[i].bytes));
  return text;
}

// Changes of the layout a user can make with flags, each with the busiest rank's
// plan under it; those that do not resolve for this world are left out.
struct Alternative {
  std::string flags;
  RankMemoryPlan plan;
};

std::vector<Alternative> alternatives(const Config& config, int world, const kernels::Kernels& k) {
  std::vector<std::pair<std::string, std::function<void(Config&)>>> changes;
  const ParallelConfig& p = config.parallel;
  const TrainConfig& t = config.train;
  // ZeRO and the experts split over the data-parallel ranks, dp x cp of them.
  const bool data_parallel = p.dp * p.cp > 1;
  if (p.zero == 0 && data_parallel) changes.push_back({"--parallel.zero=1", [](Config& c) { c.parallel.zero = 1; }});
  if (p.zero < 2 && data_parallel) changes.push_back({"--parallel.zero=2", [](Config& c) { c.parallel.zero = 2; }});
  if (p.zero < 3 && data_parallel) changes.push_back({"--parallel.zero=3", [](Config& c) { c.parallel.zero = 3; }});
  if (t.recompute != Recompute::full) changes.push_back({"--train.recompute=full", [](Config& c) { c.train.recompute = Recompute::full; }});
  if (t.recompute_layers > 0)  // every layer recomputed, not some
    changes.push_back({"--train.recompute_layers=0", [](Config& c) { c.train.recompute_layers = 0; }});
  if (t.micro_batch > 1) changes.push_back({"--train.micro_batch=1", [](Config& c) { c.train.micro_batch = 1; }});
  // A mixture of experts: its experts split over more of the dp ranks.
  for (int ep = p.ep * 2; transformer_spec(config.model).n_experts > 0 && ep <= p.ep * 8 && data_parallel; ep *= 2)
    changes.push_back({"--parallel.ep=" + std::to_string(ep), [ep](Config& c) { c.parallel.ep = ep; }});
  for (int factor : {2, 4, 8}) {
    const int tp = p.tp * factor, pp = p.pp * factor;
    changes.push_back({"--parallel.tp=" + std::to_string(tp), [tp](Config& c) { c.parallel.tp = tp; }});
    changes.push_back({"--parallel.pp=" + std::to_string(pp), [pp](Config& c) { c.parallel.pp = pp; }});
  }
  changes.push_back({std::string("--parallel.zero=3 --train.recompute=full --train.micro_batch=1") +
                         (t.recompute_layers > 0 ? " --train.recompute_layers=0" : ""),
                     [](Config& c) {
                       c.parallel.zero = 3;
                       c.train.recompute = Recompute::full;
                       c.train.recompute_layers = 0;
                       c.train.micro_batch = 1;
                     }});
  std::vector<Alternative> out;
  for (const auto& [flags, change] : changes) {
    Config c = config;
    c.parallel.dp = 0;  // follows tp and pp
    change(c);
    try {
      // Hybrid sharding's groups only where they still divide the new dp.
      const ParallelDims d = ParallelDims::resolve(world, {{Axis::dp, 0}, {Axis::pp, c.parallel.pp}, {Axis::tp, c.parallel.tp}, {Axis::cp, c.parallel.cp}});
      if (c.parallel.shard_size > 0 && d.size(Axis::dp) % c.parallel.shard_size != 0) c.parallel.shard_size = 0;
      resolve_for_world(c, world);
      if ((c.train.global_batch / c.parallel.dp) % c.train.micro_batch != 0) continue;
      out.push_back({flags, busiest_rank_plan(c, k)});
    } catch (const UsageError&) {
      // not a layout of this world or this model
    }
  }
  return out;
}

}  // namespace

RankMemoryPlan check_memory_fits(const Config& config, ParallelState& parallel, const kernels::Kernels& k) {
  Communicator& node = parallel.node();
  const kernels::Kernels::MemoryPool pool = k.memory_pool();
  // The node leader also holds the other ranks' checkpoint pieces during a save.
  const double pieces = static_cast<double>(checkpoint_piece_bytes(config, parallel.coords()));
  const double node_pieces = node.all_reduce(pieces);
  const RankMemoryPlan plan =
      plan_rank_memory(config, parallel.coords(), k, node.rank() == 0,
                       node.rank() == 0 ? static_cast<size_t>(node_pieces - pieces) : 0, /*device_only=*/false,
                       /*partner_copies=*/parallel.nodes() > 1);

  // Every rank's (memory pool, its bytes there, host, its host bytes), over the world:
  // ranks sharing a pool or a host sum their demands (parallel.ranks_per_node may cut
  // one machine into several "nodes", which still share its RAM).
  Communicator& world = parallel.world();
  const int n = world.size(), me = world.rank();
  const auto key_of = [](const std::string& text) {
    return static_cast<double>(std::hash<std::string>{}(text) & ((uint64_t{1} << 52) - 1));
  };
  char hostname[256] = "";
  gethostname(hostname, sizeof hostname - 1);
  std::vector<double> table(4 * static_cast<size_t>(n), 0.0);
  const double pool_key = key_of(pool.key), host_key = key_of(hostname);
  table[4 * me] = pool_key;
  table[4 * me + 1] = static_cast<double>(plan.device_bytes());
  table[4 * me + 2] = host_key;
  table[4 * me + 3] = static_cast<double>(plan.host_bytes());
  world.all_reduce(std::span<double>(table));
  PoolDemand device{pool.name, 0, static_cast<double>(pool.free_bytes), 0};
  PoolDemand host{"RAM", 0, static_cast<double>(available_memory_bytes()), 0};
  for (int r = 0; r < n; r++) {
    if (table[4 * r] == pool_key) device.need += table[4 * r + 1], device.ranks++;
    if (table[4 * r + 2] == host_key) host.need += table[4 * r + 3], host.ranks++;
  }
  if (k.host_memory()) {  // one memory: the host's RAM holds everything
    device.need += host.need;
    host = {};
  }

  run_collectively([&] {
    const PoolDemand& short_one = !device.fits() ? device : host;
    if (device.fits() && host.fits()) return;
    // Which changes would fit, judged by the busiest rank times the ranks sharing the memory.
    std::string fixes;
    for (const Alternative& a : alternatives(config, parallel.dims().world(), k)) {
      const double dev = static_cast<double>(k.host_memory() ? a.plan.total_bytes() : a.plan.device_bytes());
      const double hst = k.host_memory() ? 0.0 : static_cast<double>(a.plan.host_bytes());
      if (dev * device.ranks > kUsableFraction * device.free || hst * host.ranks > kUsableFraction * host.free) continue;
      fixes += "\n  " + a.flags + ": " + gib_text(dev + hst) + " per rank";
    }
    if (fixes.empty())
      fixes = "\n  none of zero, recompute, a smaller micro-batch or more tp/pp on " +
              std::to_string(parallel.dims().world()) + " ranks: more nodes (or GPUs) are needed";
    char head[512];
    std::snprintf(head, sizeof head,
                  "the run does not fit in memory: %d rank(s) sharing %s need %s, %s of %s is free (%.0f%% usable). "
                  "This rank (dp %d, tp %d, pp %d) needs %s: ",
                  short_one.ranks, short_one.name.c_str(), gib_text(short_one.need).c_str(),
                  gib_text(short_one.free).c_str(), short_one.name.c_str(), kUsableFraction * 100,
                  parallel.coord(Axis::dp), parallel.coord(Axis::tp), parallel.coord(Axis::pp),
                  gib_text(static_cast<double>(plan.total_bytes())).c_str());
    throw UsageError(std::string(head) + largest_parts(plan, 4) + ". Would fit:" + fixes);
  });
  return plan;
}

}  // namespace trident
