#include "parallel/mpi_communicator.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <utility>

#include "health/health_verdict.h"
#include "runtime/exit_codes.h"
#include "monitor/step_trace.h"
#include "runtime/timer.h"

namespace trident {

const char* comm_op_name(CommOp op) {
  static const char* names[kCommOps] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                        "send", "recv", "barrier", "connect", "all_to_all"};
  return names[static_cast<int>(op)];
}

uint64_t CommStats::total_bytes() const {
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  return total;
}

namespace {

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, message, &length);
  throw InfrastructureError(std::string(what) + ": " + std::string(message, length));
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::sum ? MPI_SUM : MPI_MAX; }

class MpiRequest final : public Request {
 public:
  MpiRequest(MPI_Request request, CommOp op, size_t count, uint64_t seq, int peer, const MpiCommunicator& comm,
             std::shared_ptr<Watchdog> watchdog)
      : request_(request), op_(op), count_(count), seq_(seq), peer_(peer), comm_(comm), watchdog_(std::move(watchdog)) {}
  ~MpiRequest() override {
    if (request_ != MPI_REQUEST_NULL) wait();
  }

  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), comm_op_name(op_));
    return done != 0;
  }

  void wait() override { wait_bounded([this] { return test(); }, "", op_, count_, comm_, *watchdog_, {}, seq_, peer_); }

 private:
  MPI_Request request_;
  CommOp op_;
  size_t count_;
  uint64_t seq_;  // its number among the group's collectives (0: point-to-point)
  int peer_;      // point-to-point: the other side (group rank), else -1
  const MpiCommunicator& comm_;
  std::shared_ptr<Watchdog> watchdog_;
};

}  // namespace

MissingMembers missing_members(const Communicator& group, CommOp op, uint64_t seq, int world_rank, double silent_s) {
  MissingMembers m;
  std::string missing, silent, unseen;
  char item[160];
  int seen = 0;
  const auto name_node = [&m](int r, const progress_board::Seen& s) {
    m.here.push_back(r);
    if (("," + m.nodes + ",").find("," + s.node + ",") == std::string::npos)
      m.nodes += (m.nodes.empty() ? "" : ",") + s.node;
    if (s.started) m.last_step = std::max(m.last_step, s.step);
  };
  const std::vector<int> members = group.world_ranks();
  for (int r : members) {
    if (r == world_rank) continue;
    const progress_board::Seen s = progress_board::lookup(r, group.board_key());
    seen += s.visible;
    // Its poll loops have not run for most of the timeout: stopped, or hung in a kernel,
    // whether it had come to this operation or waits in another.
    const bool stopped = s.visible && s.silent_s >= silent_s;
    if (!s.visible) {
      unseen += (unseen.empty() ? "" : ", ") + std::to_string(r);
    } else if (s.seq < seq) {
      if (s.started)
        std::snprintf(item, sizeof item, "%d (its last was #%llu, at step %d, %.1f s ago)", r,
                      static_cast<unsigned long long>(s.seq), s.step, s.seconds_ago);
      else
        std::snprintf(item, sizeof item, "%d (none yet on this group)", r);
      const bool held_up = s.waiting && !stopped;  // held up by another, not the one that stopped
      missing += (missing.empty() ? "" : ", ") + std::string(item) + (held_up ? " (waiting itself)" : "");
      if (!held_up) name_node(r, s);
    } else if (stopped) {
      std::snprintf(item, sizeof item, "%d (silent for %.1f s)", r, s.silent_s);
      silent += (silent.empty() ? "" : ", ") + std::string(item);
      name_node(r, s);
    }
  }
  const std::string what = std::string(comm_op_name(op)) + " (#" + std::to_string(seq) + " on the group)";
  std::string said;
  if (!missing.empty()) said = "ranks that had not started this " + what + ": " + missing;
  if (!silent.empty())
    said += (said.empty() ? "" : "; ") + std::string("ranks that started this ") + what + " and then stopped: " + silent;
  if (said.empty())
    said = seen > 0 ? "every member on this machine had started this " + what + ": it is stuck inside it"
                    : "no other member is on this machine";
  m.report = "trident: rank " + std::to_string(world_rank) + ": of the " + group.name() + " group, " + said;
  if (!unseen.empty()) m.report += "; on other machines, not visible from here: " + unseen;
  m.report += "\n";
  return m;
}

MissingMembers stopped_peer(const Communicator& group, CommOp op, int peer, int world_rank, double silent_s) {
  MissingMembers m;
  const std::vector<int> members = group.world_ranks();
  if (peer < 0 || peer >= static_cast<int>(members.size()) || members[peer] == world_rank) return m;
  const int r = members[peer];
  const progress_board::Seen s = progress_board::lookup(r, group.board_key());
  const std::string rank = "trident: rank " + std::to_string(world_rank) + ": of the " + group.name() + " group, rank " +
                           std::to_string(r) + " (this " + comm_op_name(op) + "'s other side) ";
  if (!s.visible) {
    m.report = rank + "is on another machine, not visible from here\n";
    return m;
  }
  char item[96];
  std::snprintf(item, sizeof item, "has been silent for %.1f s", s.silent_s);
  m.report = rank + item + (s.silent_s >= silent_s ? ": stopped" : ": not stopped") + "\n";
  if (s.silent_s < silent_s) return m;
  m.here.push_back(r);
  m.nodes = s.node;
  m.last_step = s.latest_step;
  return m;
}

namespace {

// The members of this machine that never came: their host is the one to take out.
health::Verdict stopped_ranks_verdict(const MissingMembers& m, CommOp op, const Communicator& group, double waited_s,
                                      int step) {
  health::Verdict v;
  v.host = m.nodes;
  v.ranks = m.here;
  std::string ranks;
  for (int r : m.here) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
  char reason[256];
  std::snprintf(reason, sizeof reason, "rank%s %s stopped (%s): %s on the %s group waited %.0f s for it",
                m.here.size() > 1 ? "s" : "", ranks.c_str(),
                m.last_step >= 0 ? ("last seen in step " + std::to_string(m.last_step + 1)).c_str() : "before its first step",
                comm_op_name(op), group.name().c_str(), waited_s);
  v.reason = reason;
  // The report without its "trident: rank N: " and its newline.
  v.evidence = m.report;
  if (const size_t said = v.evidence.find(": of the "); said != std::string::npos) v.evidence.erase(0, said + 2);
  if (!v.evidence.empty() && v.evidence.back() == '\n') v.evidence.pop_back();
  v.evidence += " (the timeout came in step " + std::to_string(step + 1) + ")";
  return v;
}

}  // namespace

void wait_bounded(const std::function<bool()>& done, const char* backend, CommOp op, size_t count,
                  const Communicator& group, const Watchdog& watchdog, const std::function<void()>& before_abort,
                  uint64_t seq, int peer) {
  // The time this rank waits for the operation, on the step's timeline when one is recorded.
  const trace::Span span("communication", [&] { return std::string(comm_op_name(op)) + " " + group.name(); });
  const progress_board::Waiting waiting;
  Timer timer;
  for (long spins = 0; !done(); spins++) {
    if (spins % 64 == 0) progress_board::beat();  // alive: this rank's loop still polls
    if (spins % 64 == 0 && timer.seconds() > watchdog.timeout_s) {
      std::fflush(stdout);  // the report comes after what was printed before it, in a combined log
      char host[256] = "?";
      gethostname(host, sizeof host - 1);
      int world_rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      std::fprintf(stderr,
                   "trident: rank %d (%s): timeout: %s%s of %zu elements on the %s group (rank %d of %d) "
                   "did not complete within %.0f s (parallel.timeout_s) at step %d; aborting the job\n",
                   world_rank, host, backend, comm_op_name(op), count, group.name().c_str(), group.rank(),
                   group.size(), timer.seconds(), watchdog.step);
      if (seq > 0 || peer >= 0) {
        // A live member beats at least every poll; one silent for half the timeout is not.
        const MissingMembers missing = seq > 0 ? missing_members(group, op, seq, world_rank, watchdog.timeout_s / 2)
                                               : stopped_peer(group, op, peer, world_rank, watchdog.timeout_s / 2);
        std::fprintf(stderr, "%s", missing.report.c_str());
        if (!missing.here.empty()) {
          std::fflush(stderr);
          health::write(stopped_ranks_verdict(missing, op, group, timer.seconds(), watchdog.step));
        }
      }
      if (peer >= 0) {
        const std::vector<int> members = group.world_ranks();
        std::fprintf(stderr, "trident: rank %d: the %s was %s rank %d (rank %d of the %s group)\n", world_rank,
                     comm_op_name(op), op == CommOp::send ? "to" : "from",
                     peer < static_cast<int>(members.size()) ? members[peer] : -1, peer, group.name().c_str());
      }
      std::fflush(stderr);
      if (before_abort) before_abort();
      MPI_Abort(MPI_COMM_WORLD, kExitTimeout);
      std::_Exit(kExitTimeout);
    }
    if (spins > 1000) sched_yield();  // let a rank sharing this core run
  }
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, std::shared_ptr<Watchdog> watchdog)
    : comm_(comm), name_(std::move(name)), watchdog_(std::move(watchdog)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

RequestPtr MpiCommunicator::started(MPI_Request request, CommOp op, size_t count, int peer) {
  return std::make_unique<MpiRequest>(request, op, count, std::exchange(last_started_, 0), peer, *this, watchdog_);
}

std::vector<int> MpiCommunicator::world_ranks() const {
  MPI_Group mine, world;
  MPI_Comm_group(comm_, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> local(size_), global(size_);
  for (int r = 0; r < size_; r++) local[r] = r;
  MPI_Group_translate_ranks(mine, size_, local.data(), world, global.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  return global;
}

RequestPtr MpiCommunicator::start_all_reduce(void* data, size_t count, size_t bytes, MPI_Datatype type, ReduceOp op) {
  last_started_ = count_started(CommOp::all_reduce, bytes, watchdog_->step);
  MPI_Request r;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), type, mpi_op(op), comm_, &r), "MPI_Iallreduce");
  return started(r, CommOp::all_reduce, count);
}

RequestPtr MpiCommunicator::all_reduce_async(std::span<float> data, ReduceOp op) {
  return start_all_reduce(data.data(), data.size(), data.size_bytes(), MPI_FLOAT, op);
}

RequestPtr MpiCommunicator::all_reduce_async(std::span<double> data, ReduceOp op) {
  return start_all_reduce(data.data(), data.size(), data.size_bytes(), MPI_DOUBLE, op);
}

RequestPtr MpiCommunicator::reduce_scatter_async(std::span<const float> in, std::span<float> out) {
  check(in.size() == out.size() * size_, "reduce_scatter: input must hold size() blocks of the output's size");
  last_started_ = count_started(CommOp::reduce_scatter, in.size_bytes(), watchdog_->step);
  MPI_Request r;
  check_mpi(MPI_Ireduce_scatter_block(in.data(), out.data(), static_cast<int>(out.size()), MPI_FLOAT, MPI_SUM,
                                      comm_, &r),
            "MPI_Ireduce_scatter_block");
  return started(r, CommOp::reduce_scatter, in.size());
}

RequestPtr MpiCommunicator::all_gather_async(std::span<float> data) {
  check(data.size() % size_ == 0, "all_gather: buffer must hold size() equal blocks");
  last_started_ = count_started(CommOp::all_gather, data.size_bytes(), watchdog_->step);
  const int block = static_cast<int>(data.size() / size_);
  MPI_Request r;
  check_mpi(MPI_Iallgather(MPI_IN_PLACE, block, MPI_FLOAT, data.data(), block, MPI_FLOAT, comm_, &r),
            "MPI_Iallgather");
  return started(r, CommOp::all_gather, data.size());
}

RequestPtr MpiCommunicator::send_async(std::span<const float> data, int peer, int tag) {
  last_started_ = count_started(CommOp::send, data.size_bytes(), watchdog_->step);
  MPI_Request r;
  check_mpi(MPI_Isend(data.data(), static_cast<int>(data.size()), MPI_FLOAT, peer, tag, comm_, &r), "MPI_Isend");
  return started(r, CommOp::send, data.size(), peer);
}

RequestPtr MpiCommunicator::recv_async(std::span<float> data, int peer, int tag) {
  last_started_ = count_started(CommOp::recv, data.size_bytes(), watchdog_->step);
  MPI_Request r;
  check_mpi(MPI_Irecv(data.data(), static_cast<int>(data.size()), MPI_FLOAT, peer, tag, comm_, &r), "MPI_Irecv");
  return started(r, CommOp::recv, data.size(), peer);
}

namespace {

std::span<float> host_floats(ActivationSpan data) {
  check(data.type == kernels::DType::f32,
        "the MPI backend moves float activations only; bf16 activations live on a GPU and go through NCCL");
  return {reinterpret_cast<float*>(data.data), data.count};
}

}  // namespace

RequestPtr MpiCommunicator::all_reduce_async(ActivationSpan data, ReduceOp op) {
  return all_reduce_async(host_floats(data), op);
}

RequestPtr MpiCommunicator::reduce_scatter_async(ActivationSpan in, ActivationSpan out) {
  return reduce_scatter_async(std::span<const float>(host_floats(in)), host_floats(out));
}

RequestPtr MpiCommunicator::all_gather_async(ActivationSpan data) { return all_gather_async(host_floats(data)); }

RequestPtr MpiCommunicator::send_async(ActivationSpan data, int peer, int tag) {
  return send_async(std::span<const float>(host_floats(data)), peer, tag);
}

RequestPtr MpiCommunicator::recv_async(ActivationSpan data, int peer, int tag) {
  return recv_async(host_floats(data), peer, tag);
}

namespace {

// A request that keeps what MPI reads until the operation completes (MPI_Ialltoallv's
// counts and displacements).
class KeepingRequest final : public Request {
 public:
  KeepingRequest(std::vector<int> kept, RequestPtr inner) : kept_(std::move(kept)), inner_(std::move(inner)) {}
  ~KeepingRequest() override { inner_.reset(); }  // waits before kept_ goes
  bool test() override { return inner_->test(); }
  void wait() override { inner_->wait(); }

 private:
  std::vector<int> kept_;
  RequestPtr inner_;
};

}  // namespace

RequestPtr MpiCommunicator::all_to_all_v_async(ActivationSpan send, const std::vector<size_t>& send_counts,
                                               ActivationSpan recv, const std::vector<size_t>& recv_counts) {
  check(send_counts.size() == static_cast<size_t>(size_) && recv_counts.size() == static_cast<size_t>(size_),
        "all_to_all_v: one count per rank");
  const std::span<float> out = host_floats(send), in = host_floats(recv);
  // counts and displacements, sent then received, in one vector that outlives the operation
  std::vector<int> v(4 * static_cast<size_t>(size_));
  size_t sent = 0, received = 0;
  for (int p = 0; p < size_; p++) {
    // MPI's counts and displacements are ints
    check(send_counts[p] < (size_t{1} << 31) && recv_counts[p] < (size_t{1} << 31) && sent < (size_t{1} << 31) &&
              received < (size_t{1} << 31),
          "all_to_all_v: a block or an offset over 2^31 elements");
    v[p] = static_cast<int>(send_counts[p]);
    v[size_ + p] = static_cast<int>(sent);
    v[2 * size_ + p] = static_cast<int>(recv_counts[p]);
    v[3 * size_ + p] = static_cast<int>(received);
    sent += send_counts[p];
    received += recv_counts[p];
  }
  check(sent <= out.size() && received <= in.size(), "all_to_all_v: the counts exceed the buffers");
  // Counted: what leaves this rank (its own block stays in memory).
  last_started_ = count_started(CommOp::all_to_all, (sent - send_counts[rank_]) * sizeof(float), watchdog_->step);
  MPI_Request r;
  const int n = size_;
  check_mpi(MPI_Ialltoallv(out.data(), v.data(), v.data() + n, MPI_FLOAT, in.data(), v.data() + 2 * n,
                           v.data() + 3 * n, MPI_FLOAT, comm_, &r),
            "MPI_Ialltoallv");
  RequestPtr inner = started(r, CommOp::all_to_all, sent);
  return std::make_unique<KeepingRequest>(std::move(v), std::move(inner));
}

void MpiCommunicator::broadcast(std::span<float> data, int root) {
  last_started_ = count_started(CommOp::broadcast, data.size_bytes(), watchdog_->step);
  MPI_Request r;
  check_mpi(MPI_Ibcast(data.data(), static_cast<int>(data.size()), MPI_FLOAT, root, comm_, &r), "MPI_Ibcast");
  started(r, CommOp::broadcast, data.size())->wait();
}

namespace {

int byte_count(size_t bytes) {
  check(bytes <= static_cast<size_t>(std::numeric_limits<int>::max()), "a host message of 2 GiB or more");
  return static_cast<int>(bytes);
}

}  // namespace

RequestPtr MpiCommunicator::send_async(std::span<const std::byte> data, int peer, int tag) {
  last_started_ = count_started(CommOp::send, data.size(), watchdog_->step);
  MPI_Request r;
  check_mpi(MPI_Isend(data.data(), byte_count(data.size()), MPI_BYTE, peer, tag, comm_, &r), "MPI_Isend");
  return started(r, CommOp::send, data.size(), peer);
}

RequestPtr MpiCommunicator::recv_async(std::span<std::byte> data, int peer, int tag) {
  last_started_ = count_started(CommOp::recv, data.size(), watchdog_->step);
  MPI_Request r;
  check_mpi(MPI_Irecv(data.data(), byte_count(data.size()), MPI_BYTE, peer, tag, comm_, &r), "MPI_Irecv");
  return started(r, CommOp::recv, data.size(), peer);
}

void MpiCommunicator::broadcast(std::span<std::byte> data, int root) {
  last_started_ = count_started(CommOp::broadcast, data.size(), watchdog_->step);
  MPI_Request r;
  check_mpi(MPI_Ibcast(data.data(), byte_count(data.size()), MPI_BYTE, root, comm_, &r), "MPI_Ibcast");
  started(r, CommOp::broadcast, data.size())->wait();
}

void MpiCommunicator::barrier() {
  last_started_ = count_started(CommOp::barrier, 0, watchdog_->step);
  MPI_Request r;
  check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
  started(r, CommOp::barrier, 0)->wait();
}

}  // namespace trident
