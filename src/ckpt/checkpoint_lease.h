// One checkpoint folder, one run: a lease on checkpoint.dir, taken by `trident train`'s
// rank 0 before anything is written there, renewed as the run goes, removed at its end.
//
//   <dir>/LEASE   one line of JSON: host, pid, Slurm job (and array) id, when taken and
//                 last renewed, the lease_s its holder promises to renew within, a nonce
//
// No flock (NFS and Lustre mounts may not honour it): every change is a whole file put
// in place by a name operation in the same folder (link, rename), then read back.
// - Taking a free folder: the lease is written under a temporary name, synced, and
//   link()ed to LEASE, which fails with EEXIST for every taker but one; read back after
//   a moment (settle_s), it must hold our nonce.
// - A lease held by another run is judged (judge_lease): live (the run ends with one
//   error naming the holder: exit 2), or free to take: stale (not renewed within the
//   lease_s its holder wrote), its process gone (same host, boot and PID namespace, no
//   such process), or the same Slurm job (a requeue). Taking it over: a claim named by
//   the old lease's nonce is link()ed (one taker at a time), LEASE is read again and,
//   only if it is still the lease judged, our lease is renamed over it; the claim is then
//   removed and the lease read back. A taker that finds the claim taken judges again.
// - Renewing (rank 0, at step ends, at most every renew_every_s): LEASE read and its
//   nonce compared with ours, then a new file renamed over it. A lease that holds
//   another nonce, or none, was taken over (judged stale, or by a requeue of our job):
//   the run ends before its next checkpoint, exit 2, naming who holds the folder now.
// What remains: a read and a rename are two operations. A holder renewing between a
// taker's read and rename overwrites the taker, which sees that in its read-back (or at
// its first renewal) and stops; and a claim broken as dead (10 s) while its taker is
// stalled between read and rename could let two takers in: the one whose nonce is gone
// stops at its next renewal, and a save is always preceded by that check.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace trident {

// Who holds (or wants) a lease: a lease file's fields.
struct LeaseHolder {
  std::string host;             // gethostname()
  long pid = 0;
  std::string job;              // SLURM_JOB_ID ("": not under Slurm)
  std::string array_job, array_task;  // SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID, where set
  std::string restart;          // SLURM_RESTART_COUNT, where set (a requeue's number)
  std::string boot_id, pid_ns;  // this boot of the machine, the PID namespace (Linux)
  unsigned long long start_ticks = 0;  // the process's start time (/proc/PID/stat), against PID reuse
  std::string nonce;            // random, one per CheckpointLease
  double acquired = 0, renewed = 0;  // Unix time (s)
  double lease_s = 0;           // renewed within this, or stale

  // "host h, pid p, Slurm job j (array 7_3), renewed 2.5 s ago": for messages, at `now`.
  std::string describe(double now) const;
};

// This process, with a fresh nonce.
LeaseHolder this_process(double lease_s);
// The lease file's text, and back (UsageError on text that is not one).
std::string lease_json(const LeaseHolder& h);
LeaseHolder parse_lease(const std::string& text);

// Whether `me` may take a lease that `holder` has: Unix time `now`, the lease file's
// modification time `file_mtime` (the file server's clock: the later of it and the
// holder's renewal counts, so that a holder whose clock lags is not judged stale early),
// `fallback_lease_s` for a lease that names none. Pure, for the tests.
struct LeaseVerdict {
  enum Kind { live, stale, process_gone, same_job } kind = live;
  double age_s = 0;  // since the lease was last renewed
  std::string why;   // "not renewed for 7.1 s (its lease_s: 5 s)", "its process is gone", ...
  bool may_take() const { return kind != live; }
};
LeaseVerdict judge_lease(const LeaseHolder& holder, const LeaseHolder& me, double now, double file_mtime,
                         double fallback_lease_s, bool holder_process_gone);
// Whether `holder`'s process is gone: only answerable on its own machine (same host, same
// boot, same PID namespace); false wherever it cannot be known.
bool holder_process_gone(const LeaseHolder& holder, const LeaseHolder& me);

class CheckpointLease {
 public:
  struct Options {
    double lease_s = 0;    // checkpoint.lease_s; 0: auto (below)
    double min_lease_s = 600;  // auto: at least this (parallel.timeout_s)
    double settle_s = 0.05;    // the wait before a new lease is read back
  };
  // Takes the lease on `dir` (made if missing) as `me`. UsageError naming the holder when
  // another run holds it, or naming the error when the folder cannot be written (read-only,
  // full). A lease taken over is said on stderr (warning, naming its old holder).
  CheckpointLease(const std::string& dir, const Options& options, LeaseHolder me);
  CheckpointLease(const std::string& dir, const Options& options);
  // Releases it when still held (a run's ordered end, an error included).
  ~CheckpointLease();
  CheckpointLease(const CheckpointLease&) = delete;
  CheckpointLease& operator=(const CheckpointLease&) = delete;

  // At a step's end: renews the lease when renew_every_s has passed since the last
  // renewal, or checks it now (`check_now`: before a save). False when the lease is no
  // longer ours (lost_to() says to whom); a failed write is a warning, not a loss.
  bool renew(bool check_now = false);
  // Removes LEASE if it still holds our nonce.
  void release();

  const std::string& path() const { return path_; }
  const LeaseHolder& me() const { return me_; }
  // The lease in effect: checkpoint.lease_s, or auto: the larger of min_lease_s and 4x the
  // longest time between two renew() calls so far (a step and its checkpoint).
  double lease_s() const;
  double renew_every_s() const;
  // The old holder and why it was taken over; "" when the folder was free.
  const std::string& taken_over() const { return taken_over_; }
  const std::string& lost_to() const { return lost_to_; }

 private:
  using Clock = std::chrono::steady_clock;
  void acquire();
  // After a moment (settle_s), whether LEASE holds our nonce.
  bool confirmed();
  // Temporaries and claims left a minute ago by writers killed in their moment.
  void remove_leftovers();
  // Writes our lease (renewed now) to a fresh temporary name, synced; returns it.
  std::string write_temporary();

  std::string dir_, path_;
  Options options_;
  LeaseHolder me_;
  bool held_ = false;
  std::string taken_over_, lost_to_;
  Clock::time_point last_write_, last_call_;
  bool called_ = false;
  double longest_gap_s_ = 0;
  bool warned_write_ = false, warned_gap_ = false;
};

}  // namespace trident
