// Goodput: where a run's wall time went, so that a person sees in numbers what a failure,
// a checkpoint or the data cost (Google's ML Goodput, HyperPod's checkpointless recovery
// report). Every second of the run falls in one part:
//   productive   the steps that moved training forward (their data wait apart);
//   recomputed   steps trained again after a failure: those past the checkpoint the run
//                resumed from, up to the step the failed run had reached (lost work);
//   restart      from the failed run's last heartbeat to this run's first step (the crash,
//                the requeue or the restart in the allocation, this run's start and load);
//   startup      a run that starts afresh, or after a complete one: its setup and load;
//   checkpoint   training blocked on saves;
//   data wait    steps waiting for their batch;
//   evaluation   validation losses and samples;
//   other        the rest (logging, replica checks, the end of the run): what the parts
//                do not name, so that they add up to the wall time.
// The heartbeat (<checkpoint.dir>/heartbeat.json, rank 0's, replaced after every step)
// says which step the run last completed, when, whether the run ended complete, and the
// job's parts so far; the next run reads it and goes on from there, so that the figures
// are the job's, over all its runs, and add up to its wall time.
#pragma once

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <vector>


namespace trident {

// The parts, in the order of monitor/run_metrics.h's kGoodputMetrics after the ratio, and
// their names (summary.json's keys; the printed line's with '_' as ' ').
enum class GoodputPart { productive, recomputed, restart, startup, checkpoint, data_wait, evaluation, other };
inline constexpr int kGoodputParts = 8;
inline constexpr const char* kGoodputPartNames[kGoodputParts] = {
    "productive", "recomputed", "restart", "startup", "checkpoint", "data_wait", "evaluation", "other"};

// Seconds per part (GoodputLedger::parts).
struct GoodputParts {
  std::array<double, kGoodputParts> seconds{};
  double& operator[](GoodputPart p) { return seconds[static_cast<int>(p)]; }
  double operator[](GoodputPart p) const { return seconds[static_cast<int>(p)]; }
  double total() const {
    double sum = 0;
    for (double s : seconds) sum += s;
    return sum;
  }
  double ratio() const { return total() > 0 ? (*this)[GoodputPart::productive] / total() : 0.0; }
};

struct Heartbeat {
  int step = 0;            // the last step completed
  double unix_time = 0;    // when (wall clock)
  bool complete = false;   // the run ended having trained all its steps (not a failure)
  GoodputParts goodput;    // the job's so far: every run in this folder up to this step
};
// The heartbeat of the run that used checkpoint folder `dir` last; nullopt: none (or unreadable).
std::optional<Heartbeat> read_heartbeat(const std::string& dir);
// Replaces it (a new file renamed over the old one: a reader never sees half of one).
void write_heartbeat(const std::string& dir, const Heartbeat& beat);



class GoodputLedger {
 public:
  // `previous`: the heartbeat in the checkpoint folder (nullopt: none); `resumed_from`, the
  // checkpoint step this run starts after; `start_unix`, when the run started (wall clock).
  GoodputLedger(const std::optional<Heartbeat>& previous, int resumed_from, double start_unix);

  // The first step begins: the time before it is the restart (from the failed run's last
  // heartbeat) or the startup.
  void first_step();
  // A step (0-based `step`) took `seconds`, `data_seconds` of them waiting for its batch.
  void step(int step, double seconds, double data_seconds);
  // Back at a checkpoint within the run (a divergence, a replica that differed): the
  // steps up to `reached`, the last one completed, are trained again.
  void rolled_back(int reached) { failed_step_ = std::max(failed_step_, reached); }
  // Time training was blocked on a save, or spent evaluating.
  void add(GoodputPart part, double seconds) { parts_[part] += seconds; }

  // The job's parts so far (the runs before this one in its folder, then this one's);
  // `other` the wall time they leave.
  GoodputParts parts() const;
  // For metrics: the ratio, then the parts.
  std::vector<double> values() const;
  // "goodput 93.1% of 44.0 s: productive 41.0 s, ..." (the parts that are not 0).
  std::string describe() const;
  // The restart this run accounts, where there was one: "restart after step 37: 9.8 s from
  // its last step to this run's first, 2 steps (1.1 s) trained again"; "" otherwise.
  std::string restart_line() const;

 private:
  double wall_s() const;
  GoodputParts parts_;           // this run's
  GoodputParts earlier_;         // the runs' before it (the heartbeat's)
  double start_unix_ = 0;        // this run's start (wall clock)
  double first_step_unix_ = -1;  // -1: not reached
  double failed_at_unix_ = -1;   // the failed run's last heartbeat; -1: no restart
  int failed_step_ = 0;          // the step it had reached: steps up to it are recomputed
  int recomputed_steps_ = 0;
};

}  // namespace trident
