#include "parallel/progress_board.h"

#include "health/health_verdict.h"

#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

namespace trident::progress_board {

namespace {

constexpr int kGroups = 24;       // groups a rank can be in (world, node, tp, dp, pp, embedding, ...)
constexpr int kNameBytes = 24;

struct GroupProgress {
  char name[kNameBytes];          // written once, before `named`
  std::atomic<int> named;
  std::atomic<uint64_t> seq;
  std::atomic<int> step;
  std::atomic<int64_t> at_ns;     // CLOCK_MONOTONIC: one clock for the machine's processes
};

struct RankProgress {
  std::atomic<int> world_rank;
  char node[kNameBytes * 2];  // its node as Slurm names it, written before world_rank
  std::atomic<int> waiting;  // waits for communication in progress (a stopped rank has none)
  std::atomic<int64_t> beat_ns;  // its last beat() (CLOCK_MONOTONIC)
  GroupProgress groups[kGroups];
};
// The processes share these atomics through the mapping: they must not hide a lock.
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free &&
              std::atomic<int64_t>::is_always_lock_free);

// This process's view: the mapping and its own entry.
RankProgress* board = nullptr;
int entries = 0;
RankProgress* mine = nullptr;

int64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// Names are kept to kNameBytes - 1 characters, and compared so.
bool same_name(const char* stored, const std::string& group) { return std::strncmp(stored, group.c_str(), kNameBytes - 1) == 0; }

const GroupProgress* find(const RankProgress& r, const std::string& group) {
  for (const GroupProgress& g : r.groups)
    if (g.named.load(std::memory_order_acquire) && same_name(g.name, group)) return &g;
  return nullptr;
}

}  // namespace

void open() {
  if (board != nullptr) return;
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm machine;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &machine) != MPI_SUCCESS)
    return;
  int local = 0, size = 1;
  MPI_Comm_rank(machine, &local);
  MPI_Comm_size(machine, &size);
  // The first rank of the machine creates it under a name of its own and tells the others;
  // it is unlinked once all have mapped it, so that no name outlives the job.
  char name[64] = "";
  if (local == 0) std::snprintf(name, sizeof name, "/trident-progress-%d-%lld", getpid(), static_cast<long long>(now_ns()));
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, machine);
  const size_t bytes = sizeof(RankProgress) * static_cast<size_t>(size);
  int fd = -1;
  bool named = false;  // this rank made the name: it unlinks it, whatever happens next
  if (local == 0) {
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    named = fd >= 0;
    // Allocated now (not only sized): a full /dev/shm fails here, not as SIGBUS at a store.
    if (fd >= 0 && posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) {
      close(fd);
      fd = -1;
    }
  }
  int created = fd >= 0 || local != 0;
  MPI_Bcast(&created, 1, MPI_INT, 0, machine);
  if (created && local != 0) fd = shm_open(name, O_RDWR, 0600);
  void* map = fd >= 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (fd >= 0) close(fd);
  int ok = map != MAP_FAILED, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, machine);
  if (named) shm_unlink(name);
  MPI_Comm_free(&machine);
  if (!all_ok) {  // the board is a diagnostic: without it the messages just say less
    if (map != MAP_FAILED) munmap(map, bytes);
    return;
  }
  board = static_cast<RankProgress*>(map);  // zero-filled by ftruncate
  entries = size;
  mine = board + local;
  std::strncpy(mine->node, health::node_name().c_str(), sizeof mine->node - 1);
  mine->world_rank.store(world_rank + 1, std::memory_order_release);  // 0: not yet there
}

void record(const std::string& group, uint64_t seq, int step) {
  if (mine == nullptr) return;
  GroupProgress* slot = nullptr;
  for (GroupProgress& g : mine->groups) {
    if (!g.named.load(std::memory_order_relaxed)) {  // only this rank writes its entry
      std::strncpy(g.name, group.c_str(), kNameBytes - 1);
      g.named.store(1, std::memory_order_release);
      slot = &g;
      break;
    }
    if (same_name(g.name, group)) {
      slot = &g;
      break;
    }
  }
  if (slot == nullptr) return;  // more groups than slots: the rest go unrecorded
  slot->step.store(step, std::memory_order_relaxed);
  slot->at_ns.store(now_ns(), std::memory_order_relaxed);
  slot->seq.store(seq, std::memory_order_release);
  beat();
}

void beat() {
  if (mine != nullptr) mine->beat_ns.store(now_ns(), std::memory_order_relaxed);
}

Waiting::Waiting() {
  if (mine == nullptr) return;
  mine->waiting.fetch_add(1, std::memory_order_relaxed);
  beat();
}

bool waiting_now() { return mine != nullptr && mine->waiting.load(std::memory_order_relaxed) > 0; }

Waiting::~Waiting() {
  if (mine != nullptr) mine->waiting.fetch_sub(1, std::memory_order_relaxed);
}

Seen lookup(int world_rank, const std::string& group) {
  Seen s;
  for (int i = 0; i < entries; i++) {
    const RankProgress& r = board[i];
    if (r.world_rank.load(std::memory_order_acquire) != world_rank + 1) continue;
    s.visible = true;
    s.node = r.node;
    s.waiting = r.waiting.load(std::memory_order_relaxed) > 0;
    if (const int64_t beat = r.beat_ns.load(std::memory_order_relaxed); beat > 0)
      s.silent_s = static_cast<double>(now_ns() - beat) / 1e9;
    for (const GroupProgress& g : r.groups)
      if (g.named.load(std::memory_order_acquire) && g.seq.load(std::memory_order_acquire) > 0)
        s.latest_step = std::max(s.latest_step, g.step.load(std::memory_order_relaxed));
    if (const GroupProgress* g = find(r, group)) {
      s.seq = g->seq.load(std::memory_order_acquire);
      s.started = s.seq > 0;
      s.step = g->step.load(std::memory_order_relaxed);
      s.seconds_ago = static_cast<double>(now_ns() - g->at_ns.load(std::memory_order_relaxed)) / 1e9;
    }
    return s;
  }
  return s;
}

}  // namespace trident::progress_board
