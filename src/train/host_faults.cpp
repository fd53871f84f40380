#include "train/host_faults.h"

#include <algorithm>
#include <set>

#include "parallel/agreement.h"
#include "runtime/exit_codes.h"

namespace trident {

std::string host_list(const std::vector<int>& ranks, const std::vector<std::string>& hosts) {
  std::vector<std::string> seen;
  for (int r : ranks) {
    const std::string& h = r >= 0 && r < static_cast<int>(hosts.size()) ? hosts[r] : health::node_name();
    if (std::find(seen.begin(), seen.end(), h) == seen.end()) seen.push_back(h);
  }
  std::string list;
  for (const std::string& h : seen) list += (list.empty() ? "" : ",") + h;
  return list;
}

std::optional<health::Verdict> StragglerStreak::observe(const Straggler& s, int step,
                                                        const std::vector<std::string>& hosts) {
  if (!s.found) {
    rank_ = -1;
    count_ = 0;
    evidence_.clear();
    return std::nullopt;
  }
  if (s.rank != rank_) {
    rank_ = s.rank;
    count_ = 0;
    evidence_.clear();
  }
  count_++;
  char item[96];
  std::snprintf(item, sizeof item, "%sstep %d: %.2fx", evidence_.empty() ? "" : ", ", step, s.work_s / s.median_s);
  evidence_ += item;
  if (limit_ <= 0 || count_ < limit_) return std::nullopt;
  health::Verdict v;
  v.ranks = {s.rank};
  v.host = host_list(v.ranks, hosts);
  v.reason = "rank " + std::to_string(s.rank) + " a straggler for " + std::to_string(count_) +
             " log steps in a row (log.straggler_limit)";
  v.evidence = "its work against its stage's median: " + evidence_ + "; last: " + s.describe(step);
  return v;
}

std::optional<health::Verdict> GpuErrorStreak::observe(const std::vector<MachineSample>& machines, int step,
                                                       const std::vector<std::string>& hosts) {
  std::optional<health::Verdict> verdict;
  for (const MachineSample& m : machines) {
    std::vector<GpuSample>& before = last_[m.host];
    std::string rose;
    for (const GpuSample& g : m.gpus) {
      const auto was = std::find_if(before.begin(), before.end(), [&](const GpuSample& b) { return b.index == g.index; });
      if (was == before.end()) continue;
      if (g.xid_errors > was->xid_errors)
        rose += (rose.empty() ? "" : "; ") + std::string("GPU ") + std::to_string(g.index) + " XID errors " +
                std::to_string(was->xid_errors) + " -> " + std::to_string(g.xid_errors) + " (last XID " +
                std::to_string(g.last_xid) + ")";
      if (g.ecc_uncorrected > was->ecc_uncorrected)
        rose += (rose.empty() ? "" : "; ") + std::string("GPU ") + std::to_string(g.index) + " uncorrected ECC errors " +
                std::to_string(was->ecc_uncorrected) + " -> " + std::to_string(g.ecc_uncorrected);
    }
    before = m.gpus;
    if (rose.empty()) continue;
    const int n = ++count_[m.host];
    evidence_[m.host] += (evidence_[m.host].empty() ? "" : " | ") + ("step " + std::to_string(step) + ": " + rose);
    if (limit_ <= 0 || n < limit_ || verdict) continue;
    health::Verdict v;
    v.host = m.host;
    for (int r = 0; r < static_cast<int>(hosts.size()); r++)
      if (hosts[r] == m.host) v.ranks.push_back(r);
    v.reason = "GPU errors at " + std::to_string(n) + " log steps (log.gpu_error_limit)";
    v.evidence = evidence_[m.host];
    verdict = v;
  }
  return verdict;
}

std::optional<health::Verdict> ReplicaFaults::observe(const std::vector<int>& odd_ranks, bool tie,
                                                      const std::string& report, bool can_go_back,
                                                      const std::vector<std::string>& hosts) {
  if (tie) {
    if (can_go_back) return std::nullopt;
    health::Verdict v;  // no host: the batch script requeues without draining
    v.ranks = odd_ranks;
    v.reason = "replica check: replicas differ with no majority, and no checkpoint is left to go back to";
    v.evidence = report;
    return v;
  }
  // Counted once per host and check, however many of its ranks differ.
  std::set<std::string> seen;
  for (int r : odd_ranks)
    if (const std::string host = host_list({r}, hosts); seen.insert(host).second) count_[host]++;
  std::vector<int> again;
  for (int r : odd_ranks)
    if (count_[host_list({r}, hosts)] >= 2 || !can_go_back) again.push_back(r);
  if (again.empty()) return std::nullopt;
  health::Verdict v;
  v.ranks = again;
  v.host = host_list(again, hosts);
  std::string ranks;
  for (int r : again) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
  v.reason = "replica check: rank" + std::string(again.size() > 1 ? "s " : " ") + ranks + "'s parameters differ " +
             (can_go_back ? "a second time" : "and no checkpoint is left to go back to");
  v.evidence = report;
  return v;
}

HostFaults::HostFaults(const Config& config, ParallelState& parallel)
    : parallel_(parallel),
      hosts_(parallel.world().gather_strings(health::node_name())),
      stragglers_(config.log.straggler_limit),
      gpu_errors_(config.log.gpu_error_limit) {}

void HostFaults::end_run_if(const std::optional<health::Verdict>& verdict, const std::function<void()>& before) {
  const bool end = parallel_.world().all_reduce(verdict ? 1.0 : 0.0, ReduceOp::max) > 0;
  if (!end) return;
  before();
  std::string message;
  if (parallel_.is_root()) {
    health::write(*verdict);
    message = verdict->reason + (verdict->host.empty() ? "" : " on " + verdict->host) + ": " + verdict->evidence;
  }
  throw AgreedInfrastructureError(broadcast_string(message));
}

}  // namespace trident
