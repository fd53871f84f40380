// The verdict on a host that ended a job: when trident stops because of one machine (a
// rank that stopped, a failed preflight, a straggler that stays slow, GPU errors that
// repeat, a replica whose parameters differ), it says which, where the batch script finds
// it: <checkpoint.dir>/health/<SLURM_JOB_ID>.json. slurm/train.sbatch drains that node
// (or excludes it) and requeues; ParallelCluster replaces drained nodes.
#pragma once

#include <string>
#include <vector>

namespace trident::health {

struct Verdict {
  std::string host;        // the node as Slurm names it; several: comma-separated (a Slurm host list)
  std::vector<int> ranks;  // world ranks on it that the evidence is about
  std::string reason;      // one line, what the drain's Reason says
  std::string evidence;    // the figures behind it
};

// This machine's name: TRIDENT_NODE_NAME where set (containers whose host names are not
// unique; tests that play several nodes on one host), else as Slurm knows it
// (SLURMD_NODENAME in a job step), else its host name up to the first dot.
std::string node_name();

// The file a verdict of this job goes to, under `checkpoint_dir` (SLURM_JOB_ID, else
// "local"); "" for no folder.
std::string verdict_path(const std::string& checkpoint_dir);

// Where this process writes verdicts from now on: the folder made, and a probe written
// and removed. UsageError naming the folder when it cannot be written. "": nowhere.
void set_checkpoint_dir(const std::string& checkpoint_dir);

// The verdict as JSON (host, ranks, reason, evidence, job, time).
std::string to_json(const Verdict& v);
Verdict from_json(const std::string& text);

// Writes the verdict (whole or not at all: a temporary name, then a link) and says so on
// stderr; the first one written stays (ranks that time out later may be waiting on
// ranks that are themselves held up). False, with why on stderr, when it cannot or one
// was there (the job ends with exit 3 either way; without a folder nothing is written).
// Safe to call from any rank, also while the job is being aborted.
bool write(const Verdict& v);

// Removes this job's verdict, if any (an earlier run's: a run starts clean).
void clear();

}  // namespace trident::health
