#include "train/replica_check.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "parallel/agreement.h"
#include "runtime/crc32.h"

namespace trident {

namespace {

uint32_t crc_of(uint32_t crc, const float* data, size_t floats) { return crc32_of(crc, data, floats * sizeof(float)); }

// One CRC per set of data axes over these tensors of the flat buffer `values`, in order.
std::map<AxisSet, uint32_t> crcs_by_data_axes(const std::vector<ParameterTensor>& tensors, const float* values) {
  std::map<AxisSet, uint32_t> crcs;
  for (const ParameterTensor& t : tensors) {
    uint32_t& crc = crcs[t.placement.data_axes()];
    crc = crc_of(crc, values + t.offset, t.stored);
  }
  return crcs;
}

// Continues `crc` over the tensors that tp keeps whole.
uint32_t crc_of_replicated(uint32_t crc, const std::vector<ParameterTensor>& tensors, const float* values) {
  for (const ParameterTensor& t : tensors)
    if (t.placement.sharding == Sharding::replicated) crc = crc_of(crc, values + t.offset, t.stored);
  return crc;
}

// This rank's parameters in host memory: in place where they are there whole, else a copy.
const float* host_values(const ShardedParameters& params, std::vector<float>& copy) {
  if (params.memory->host_memory() && !params.sharded()) return params.values;
  copy.resize(params.layout->total_floats());
  params.to_host(copy.data());
  return copy.data();
}

std::string join(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

ReplicaCheck::ReplicaCheck(ParallelState& parallel, const ParameterLayout& layout, Communicator* replicas,
                           bool compare_tp, int every_steps)
    : parallel_(parallel),
      replicas_(replicas != nullptr && replicas->size() > 1 ? replicas : nullptr),
      compare_tp_(compare_tp && parallel.tp().size() > 1),
      has_regions_(!layout.data_regions().empty()),
      every_(every_steps) {
  for (const ParameterLayout::DataRegion& r : layout.data_regions())
    if (Communicator& holders = parallel.group(r.axes); holders.size() > 1) regions_.emplace_back(r.axes, &holders);
  std::set<AxisSet> buffer_axes;
  for (const ParameterTensor& b : layout.buffers()) buffer_axes.insert(b.placement.data_axes());
  for (AxisSet axes : buffer_axes)
    if (Communicator& holders = parallel.group(axes); holders.size() > 1) buffer_groups_.emplace_back(axes, &holders);
  comparable_ = replicas_ != nullptr || compare_tp_ || !regions_.empty() || !buffer_groups_.empty();
}

std::string ReplicaCheck::describe() const {
  if (every_ <= 0 || !comparable_) return "";
  std::string what;
  if (replicas_ != nullptr) what = "the parameters across each " + replicas_->name() + " group";
  if (compare_tp_) what += std::string(what.empty() ? "" : ", ") + "the tensors tp keeps whole across each tp group";
  for (const auto& [axes, group] : regions_)
    what += std::string(what.empty() ? "" : ", ") + "the tensors held across each " + group->name() + " group";
  for (const auto& [axes, group] : buffer_groups_)
    what += std::string(what.empty() ? "" : ", ") + "the buffers across each " + group->name() + " group";
  return "replica check: every " + std::to_string(every_) + " steps, " + what + " (train.replica_check_steps)";
}

ReplicaComparison ReplicaCheck::compare(const ShardedParameters& params, int step, const float* buffers) {
  // One line per comparison this rank takes part in: "<group> <its first world rank> <crc>".
  std::vector<float> copy;
  const float* values = host_values(params, copy);
  std::ostringstream lines;
  const ParameterLayout& layout = *params.layout;
  // A group's name as one word of these lines.
  const auto label = [](std::string name) {
    std::replace(name.begin(), name.end(), ' ', '_');
    return name;
  };
  if (replicas_ != nullptr && !has_regions_)
    lines << label(replicas_->name()) << " " << replicas_->world_ranks().front() << " "
          << crc_of(0, values, layout.total_floats()) << "\n";
  if (has_regions_) {
    // The tensors of each region across its group, the others across the replicas.
    std::map<AxisSet, uint32_t> crcs = crcs_by_data_axes(layout.tensors(), values);
    if (replicas_ != nullptr)
      lines << label(replicas_->name()) << " " << replicas_->world_ranks().front() << " " << crcs[kDataParallel] << "\n";
    for (const auto& [axes, group] : regions_)
      lines << label(group->name()) << " " << group->world_ranks().front() << " " << crcs[axes] << "\n";
  }
  if (buffers != nullptr && !layout.buffers().empty()) {  // the declared buffers, per set of data axes
    std::map<AxisSet, uint32_t> crcs = crcs_by_data_axes(layout.buffers(), buffers);
    for (const auto& [axes, group] : buffer_groups_)
      lines << label(group->name() + " buffers") << " " << group->world_ranks().front() << " " << crcs[axes] << "\n";
  }
  if (compare_tp_) {
    uint32_t crc = crc_of_replicated(0, layout.tensors(), values);
    if (buffers != nullptr) crc = crc_of_replicated(crc, layout.buffers(), buffers);
    lines << "tp " << parallel_.tp().world_ranks().front() << " " << crc << "\n";
  }
  const std::vector<std::string> all = parallel_.world().gather_strings(lines.str());
  ReplicaComparison result;
  std::string report;
  if (parallel_.is_root()) {
    // (group, first rank) -> crc -> ranks holding it
    std::map<std::pair<std::string, int>, std::map<uint32_t, std::vector<int>>> groups;
    for (int rank = 0; rank < static_cast<int>(all.size()); rank++) {
      std::istringstream in(all[rank]);
      std::string group;
      int first = 0;
      uint32_t crc = 0;
      while (in >> group >> first >> crc) {
        std::replace(group.begin(), group.end(), '_', ' ');
        groups[{group, first}][crc].push_back(rank);
      }
    }
    std::set<int> odd;
    bool tie = false;
    for (const auto& [key, by_crc] : groups) {
      if (by_crc.size() < 2) continue;
      size_t most = 0;
      for (const auto& [crc, ranks] : by_crc) most = std::max(most, ranks.size());
      int holding_most = 0;
      for (const auto& [crc, ranks] : by_crc) holding_most += ranks.size() == most;
      std::vector<int> majority, differ;
      for (const auto& [crc, ranks] : by_crc) {
        // A tie names every side: nothing tells which one is right.
        const bool is_majority = ranks.size() == most && holding_most == 1;
        (is_majority ? majority : differ).insert((is_majority ? majority : differ).end(), ranks.begin(), ranks.end());
      }
      for (int r : differ) odd.insert(r);
      tie |= majority.empty();
      report += (report.empty() ? "" : "; ") + std::string("rank") + (differ.size() > 1 ? "s " : " ") + join(differ) +
                (majority.empty() ? " disagree among themselves" : " differ" + std::string(differ.size() > 1 ? "" : "s") +
                                                                       " from rank" + (majority.size() > 1 ? "s " : " ") +
                                                                       join(majority)) +
                " (" + key.first + " group of rank " + std::to_string(key.second) + ")";
    }
    result.odd_ranks.assign(odd.begin(), odd.end());
    result.tie = tie;
    if (!odd.empty())
      report = "replica check at step " + std::to_string(step) + ": parameters that should be equal differ: " + report;
  }
  // Every rank learns the verdict: the odd ranks as text.
  const std::string odd_text = broadcast_string(join(result.odd_ranks) + (result.tie ? ";tie" : ""));
  result.tie = odd_text.find(";tie") != std::string::npos;
  result.odd_ranks.clear();
  std::istringstream in(odd_text.substr(0, odd_text.find(';')));
  for (std::string r; std::getline(in, r, ',');) result.odd_ranks.push_back(std::atoi(r.c_str()));
  result.agree = result.odd_ranks.empty();
  result.report = report;
  return result;
}

}  // namespace trident
