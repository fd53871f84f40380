// Where each rank of this machine stands in its collectives, in POSIX shared memory that
// the machine's ranks all map, so that a rank whose wait timed out can say which members of
// its group had not arrived at that operation, even members that can no longer answer
// (stopped, hung in a kernel, dead). Each communicator numbers the collectives it starts
// (every member starts them in the same order), and the board holds each rank's latest
// number per group: a member whose number on the group is below the waiting rank's has
// not reached its operation. Members on other machines are not visible here; their own
// machine's ranks name them when they time out in turn.
#pragma once

#include <cstdint>
#include <string>

namespace trident::progress_board {

// Maps this machine's board: collective over MPI_COMM_WORLD, once, after MPI_Init. Until
// then (and where shared memory fails) record() does nothing and lookup() sees nothing.
void open();

// This rank started collective number `seq` (from 1) on its group `group` at `step`.
void record(const std::string& group, uint64_t seq, int step);

// This rank is alive: called from every wait's poll loop (and by record() and Waiting), so
// that a member that went silent inside an operation it had started (stopped, hung in a
// kernel) is told apart from one that waits on others.
void beat();

// While one lives, this rank is waiting for communication: a member that had not come to
// an operation but waits in another is held up too, not the one that stopped.
class Waiting {
 public:
  Waiting();
  ~Waiting();
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;
};

struct Seen {
  bool visible = false;  // the rank is on this machine
  std::string node;      // its node as Slurm names it (several slurmds may share a machine)
  bool waiting = false;  // it is waiting for communication itself (a Waiting lives)
  bool started = false;  // it has started a collective on that group
  uint64_t seq = 0;      // the latest one's number
  int step = -1;         // the step it was at then
  double seconds_ago = 0;  // since it started that one
  double silent_s = 0;     // since its last beat() (0: it never beat)
  int latest_step = -1;    // the latest step of its collectives on any group (-1: none yet)
};
// What the board shows of world rank `world_rank` on group `group`.
Seen lookup(int world_rank, const std::string& group);

// This rank is inside a wait now (a Waiting lives): for the fault injection that stops a
// rank in the middle of a collective.
bool waiting_now();

}  // namespace trident::progress_board
