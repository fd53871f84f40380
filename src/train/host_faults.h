// The faults that end a run because of one host, counted where training sees them: the
// same straggler log step after log step, GPU errors that keep coming, a replica whose
// parameters differ a second time. The verdict names the host (health/health_verdict.h),
// rank 0 writes it, and every rank ends with exit 3 for the batch script to drain the node
// and requeue.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "health/health_verdict.h"
#include "monitor/telemetry.h"
#include "parallel/parallel_state.h"
#include "train/stragglers.h"
#include "runtime/exit_codes.h"

namespace trident {

// Rank 0's count of a straggler's log steps in a row: a verdict at `limit` (0: never).
class StragglerStreak {
 public:
  explicit StragglerStreak(int limit) : limit_(limit) {}
  // At a log step (printed number `step`): the straggler found, if any.
  std::optional<health::Verdict> observe(const Straggler& s, int step, const std::vector<std::string>& hosts);

 private:
  int limit_, rank_ = -1, count_ = 0;
  std::string evidence_;
};

// Rank 0's count, per machine, of the log steps at which a GPU's XID or uncorrected ECC
// count rose: a verdict at `limit` (0: never).
class GpuErrorStreak {
 public:
  explicit GpuErrorStreak(int limit) : limit_(limit) {}
  std::optional<health::Verdict> observe(const std::vector<MachineSample>& machines, int step,
                                         const std::vector<std::string>& hosts);

 private:
  int limit_;
  std::map<std::string, std::vector<GpuSample>> last_;  // per host, its GPUs at the sample before
  std::map<std::string, int> count_;
  std::map<std::string, std::string> evidence_;
};

// Rank 0's count, per host, of replica checks its ranks failed: a verdict at the second
// (the first goes back to the last checkpoint), or at once where there is none.
class ReplicaFaults {
 public:
  // tie: no majority in some group (two replicas that differ): nothing tells which is
  // wrong, so no host is named (the run still ends where it cannot go back).
  std::optional<health::Verdict> observe(const std::vector<int>& odd_ranks, bool tie, const std::string& report,
                                         bool can_go_back, const std::vector<std::string>& hosts);

 private:
  std::map<std::string, int> count_;
};

class HostFaults {
 public:
  // Collective: every rank's node name, kept on rank 0.
  HostFaults(const Config& config, ParallelState& parallel);
  // Rank 0's names of the world ranks' nodes (empty elsewhere).
  const std::vector<std::string>& hosts() const { return hosts_; }
  StragglerStreak& stragglers() { return stragglers_; }
  GpuErrorStreak& gpu_errors() { return gpu_errors_; }
  ReplicaFaults& replicas() { return replicas_; }
  // Collective: when rank 0 has a verdict, `before` runs on every rank (a checkpoint in
  // flight is finished), rank 0 writes the verdict and every rank throws
  // AgreedInfrastructureError (exit 3) with its reason; else nothing happens.
  void end_run_if(const std::optional<health::Verdict>& verdict, const std::function<void()>& before);

 private:
  ParallelState& parallel_;
  std::vector<std::string> hosts_;
  StragglerStreak stragglers_;
  GpuErrorStreak gpu_errors_;
  ReplicaFaults replicas_;
};

// The hosts of `ranks`, each once, comma-separated (a Slurm host list).
std::string host_list(const std::vector<int>& ranks, const std::vector<std::string>& hosts);

}  // namespace trident
