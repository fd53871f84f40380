// The NCCL backend: collectives and point-to-point transfers on device memory, on a
// communication stream of their own that waits (through an event) for the work already
// issued to the compute stream, so the data-parallel reduction of the last layers runs
// while backward computes the first ones. A wait polls the operation's completion event
// and ncclCommGetAsyncError; past parallel.timeout_s it names the operation, group,
// rank and step, aborts the NCCL communicator (so no kernel spins on) and the job.
// Host buffers (a loss, a gathered parameter) are staged through device memory.
// Point-to-point transfers go through two more NCCL communicators, one per direction
// (towards higher ranks: activations; towards lower ranks: gradients): NCCL matches
// sends and receives by their order on a stream, and under 1F1B a stage sends its next
// activation before it receives the previous gradient, which on one stream would wait
// for each other.
// The communicators are non-blocking (ncclConfig_t::blocking = 0; NCCL_COMM_BLOCKING=1,
// which would override it, is set back to 0): NCCL's own waits for a peer (its set-up,
// a connection made on first use) return ncclInProgress at once, and the wait is ours,
// bounded like every other (settle()). At construction each communicator makes its
// first connections (a one-float all-reduce; on the pipeline's, one message each way
// between neighbours), so a rank missing at start is named there, before any step.
// Algorithms NCCL connects later (on first use, for larger messages) connect inside the
// same bounded wait; connecting every algorithm up front (NCCL_RUNTIME_CONNECT=0) is left
// to the user: on NVSwitch machines it allocates NVLS buffers the memory plan does not count.
#include "parallel/nccl_communicator.h"

#include "runtime/exit_codes.h"

#ifdef TRIDENT_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_host.h"

namespace trident {

namespace {

// A failed NCCL call is the network's or a peer's (exit 3), not trident's own.
#define NCCL_CHECK(call)                                                                          \
  do {                                                                                            \
    const ncclResult_t trident_nccl_ = (call);                                                    \
    if (trident_nccl_ != ncclSuccess)                                                             \
      throw ::trident::InfrastructureError(std::string("NCCL: ") + ncclGetErrorString(trident_nccl_) + " in " + #call); \
  } while (0)

void nccl_ok(ncclResult_t result, const char* call) {
  if (result != ncclSuccess && result != ncclInProgress)
    throw InfrastructureError(std::string("NCCL: ") + ncclGetErrorString(result) + " in " + call);
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }
ncclDataType_t nccl_type(kernels::DType type) { return type == kernels::DType::f32 ? ncclFloat32 : ncclBfloat16; }

bool on_host(const void* p) {
  cudaPointerAttributes attributes{};
  CUDA_CHECK(cudaPointerGetAttributes(&attributes, p));
  return attributes.type == cudaMemoryTypeUnregistered || attributes.type == cudaMemoryTypeHost;
}

class NcclCommunicator;

// A started operation: complete when its event on the communication stream has fired.
class NcclRequest final : public Request {
 public:
  NcclRequest(NcclCommunicator& comm, ncclComm_t nccl, CommOp op, size_t count, uint64_t seq, cudaEvent_t done,
              void* host_out = nullptr, const void* staged = nullptr, size_t bytes = 0)
      : comm_(comm), nccl_(nccl), op_(op), count_(count), seq_(seq), done_(done), host_out_(host_out), staged_(staged),
        bytes_(bytes) {}
  ~NcclRequest() override {
    try {
      if (!complete_) wait();
    } catch (const std::exception& e) {  // a destructor must not throw: report and end the job
      int world_rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      std::fprintf(stderr, "trident: rank %d: internal error: %s\n", world_rank, e.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    cudaEventDestroy(done_);
  }
  bool test() override;
  void wait() override;

 private:
  void completed();

  NcclCommunicator& comm_;
  ncclComm_t nccl_;  // the communicator it runs on
  CommOp op_;
  size_t count_;
  uint64_t seq_;  // its number among the group's collectives (0: point-to-point)
  cudaEvent_t done_;
  void* host_out_;       // host buffer to fill from the staging buffer on completion
  const void* staged_;
  size_t bytes_;
  bool complete_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<MpiCommunicator> group, std::shared_ptr<Watchdog> watchdog, bool point_to_point)
      : group_(std::move(group)), watchdog_(std::move(watchdog)) {
    if (const char* blocking = std::getenv("NCCL_COMM_BLOCKING"); blocking != nullptr && std::strcmp(blocking, "0") != 0) {
      std::fprintf(stderr, "trident: NCCL_COMM_BLOCKING=%s would make NCCL's waits unbounded: set to 0\n", blocking);
      setenv("NCCL_COMM_BLOCKING", "0", 1);
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&probe_, 2 * sizeof(float)));
    CUDA_CHECK(cudaMemset(probe_, 0, 2 * sizeof(float)));
    collectives_ = make_channel();
    if (point_to_point) {
      towards_higher_ = make_channel();
      towards_lower_ = make_channel();
    }
    connect();
  }
  ~NcclCommunicator() override {
    for (Channel* c : {&collectives_, &towards_higher_, &towards_lower_}) {
      if (c->comm == nullptr) continue;
      close(*c);
      cudaStreamDestroy(c->stream);
    }
    cudaEventDestroy(ready_);
    if (staging_ != nullptr) cudaFree(staging_);
    if (probe_ != nullptr) cudaFree(probe_);
  }

  const std::string& name() const override { return group_->name(); }
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  std::vector<int> world_ranks() const override { return group_->world_ranks(); }
  std::string board_key() const override { return group_->name() + "/nccl"; }
  const Watchdog& watchdog() const { return *watchdog_; }
  // Ends every NCCL communicator of the group, so that no kernel waits on forever.
  void abort_all() {
    for (Channel* c : {&collectives_, &towards_higher_, &towards_lower_})
      if (c->comm != nullptr) ncclCommAbort(c->comm);
  }

  RequestPtr all_reduce_async(std::span<float> data, ReduceOp op) override {
    return all_reduce(data.data(), data.size(), data.size_bytes(), ncclFloat32, op);
  }
  RequestPtr all_reduce_async(std::span<double> data, ReduceOp op) override {
    return all_reduce(data.data(), data.size(), data.size_bytes(), ncclFloat64, op);
  }
  RequestPtr all_reduce_async(ActivationSpan data, ReduceOp op) override {
    return all_reduce(data.data, data.count, data.bytes(), nccl_type(data.type), op);
  }
  RequestPtr reduce_scatter_async(std::span<const float> in, std::span<float> out) override {
    check(in.size() == out.size() * size(), "reduce_scatter: input must hold size() blocks of the output's size");
    check(!on_host(in.data()) && !on_host(out.data()), "NCCL reduce_scatter needs device buffers");
    last_started_ = count_started(CommOp::reduce_scatter, in.size_bytes(), watchdog_->step);
    after_compute(collectives_);
    settle(collectives_, ncclReduceScatter(in.data(), out.data(), out.size(), ncclFloat32, ncclSum, collectives_.comm,
                                           collectives_.stream),
           "ncclReduceScatter", CommOp::reduce_scatter, in.size());
    return finished(collectives_, CommOp::reduce_scatter, in.size());
  }
  RequestPtr all_gather_async(std::span<float> data) override {
    check(data.size() % size() == 0, "all_gather: buffer must hold size() equal blocks");
    last_started_ = count_started(CommOp::all_gather, data.size_bytes(), watchdog_->step);
    const size_t block = data.size() / size();
    float* device = stage_in(data.data(), data.size_bytes());
    after_compute(collectives_);
    settle(collectives_,
           ncclAllGather(device + rank() * block, device, block, ncclFloat32, collectives_.comm, collectives_.stream),
           "ncclAllGather", CommOp::all_gather, data.size());
    return finished_staged(CommOp::all_gather, data.size(), data.data(), device, data.size_bytes());
  }
  RequestPtr reduce_scatter_async(ActivationSpan in, ActivationSpan out) override {
    check(in.count == out.count * size() && in.type == out.type,
          "reduce_scatter: input must hold size() blocks of the output's size and type");
    check(!on_host(in.data) && !on_host(out.data), "NCCL reduce_scatter needs device buffers");
    last_started_ = count_started(CommOp::reduce_scatter, in.bytes(), watchdog_->step);
    after_compute(collectives_);
    settle(collectives_, ncclReduceScatter(in.data, out.data, out.count, nccl_type(in.type), ncclSum,
                                           collectives_.comm, collectives_.stream),
           "ncclReduceScatter", CommOp::reduce_scatter, in.count);
    return finished(collectives_, CommOp::reduce_scatter, in.count);
  }
  RequestPtr all_gather_async(ActivationSpan data) override {
    check(data.count % size() == 0, "all_gather: buffer must hold size() equal blocks");
    check(!on_host(data.data), "NCCL all_gather of activations needs device buffers");
    last_started_ = count_started(CommOp::all_gather, data.bytes(), watchdog_->step);
    const size_t block = data.count / size();
    char* base = reinterpret_cast<char*>(data.data);
    after_compute(collectives_);
    settle(collectives_,
           ncclAllGather(base + rank() * block * kernels::dtype_bytes(data.type), base, block, nccl_type(data.type),
                         collectives_.comm, collectives_.stream),
           "ncclAllGather", CommOp::all_gather, data.count);
    return finished(collectives_, CommOp::all_gather, data.count);
  }
  RequestPtr send_async(std::span<const float> data, int peer, int tag) override {
    return send(data.data(), data.size(), data.size_bytes(), ncclFloat32, peer, tag);
  }
  RequestPtr recv_async(std::span<float> data, int peer, int tag) override {
    return recv(data.data(), data.size(), data.size_bytes(), ncclFloat32, peer, tag);
  }
  RequestPtr send_async(ActivationSpan data, int peer, int tag) override {
    return send(data.data, data.count, data.bytes(), nccl_type(data.type), peer, tag);
  }
  RequestPtr recv_async(ActivationSpan data, int peer, int tag) override {
    return recv(data.data, data.count, data.bytes(), nccl_type(data.type), peer, tag);
  }
  // A ring's hop: where the send and the receive share a channel (data going one way
  // round, towards higher ranks: every rank but the ring's ends), both in one group, so
  // the hops of every rank run at once. At the ends they go on the two channels' streams,
  // which run side by side already.
  RequestPtr send_recv_async(ActivationSpan send, int to, ActivationSpan recv, int from, int tag) override {
    Channel& c = channel_to(to);
    if (&c != &channel_from(from)) return Communicator::send_recv_async(send, to, recv, from, tag);
    check(!on_host(send.data) && !on_host(recv.data), "NCCL send/recv needs device buffers");
    count_started(CommOp::send, send.bytes(), watchdog_->step);
    last_started_ = count_started(CommOp::recv, recv.bytes(), watchdog_->step);
    after_compute(c);
    NCCL_CHECK(ncclGroupStart());
    ncclResult_t queued = ncclSend(send.data, send.count, nccl_type(send.type), to, c.comm, c.stream);
    if (queued == ncclSuccess) queued = ncclRecv(recv.data, recv.count, nccl_type(recv.type), from, c.comm, c.stream);
    const ncclResult_t ended = ncclGroupEnd();  // the group ends whatever a call said
    nccl_ok(queued, "ncclSend/ncclRecv");
    settle(c, ended, "ncclGroupEnd", CommOp::send, send.count, to);
    return finished(c, CommOp::send, send.count);
  }
  // One group of sends and receives on the collectives' channel: NCCL's all-to-all.
  RequestPtr all_to_all_v_async(ActivationSpan send, const std::vector<size_t>& send_counts, ActivationSpan recv,
                                const std::vector<size_t>& recv_counts) override {
    check(send_counts.size() == static_cast<size_t>(size()) && recv_counts.size() == static_cast<size_t>(size()),
          "all_to_all_v: one count per rank");
    check(send.type == recv.type && !on_host(send.data) && !on_host(recv.data), "NCCL all_to_all_v needs device buffers");
    size_t sent = 0, received = 0;
    for (int p = 0; p < size(); p++) sent += send_counts[p], received += recv_counts[p];
    check(sent <= send.count && received <= recv.count, "all_to_all_v: the counts exceed the buffers");
    const size_t element = kernels::dtype_bytes(send.type);
    // Counted: what leaves this rank (its own block stays on the device).
    last_started_ = count_started(CommOp::all_to_all, (sent - send_counts[rank()]) * element, watchdog_->step);
    after_compute(collectives_);
    const char* out = reinterpret_cast<const char*>(send.data);
    char* in = reinterpret_cast<char*>(recv.data);
    NCCL_CHECK(ncclGroupStart());
    ncclResult_t queued = ncclSuccess;
    for (int p = 0; p < size() && queued == ncclSuccess; p++) {
      if (send_counts[p] > 0)
        queued = ncclSend(out, send_counts[p], nccl_type(send.type), p, collectives_.comm, collectives_.stream);
      if (queued == ncclSuccess && recv_counts[p] > 0)
        queued = ncclRecv(in, recv_counts[p], nccl_type(recv.type), p, collectives_.comm, collectives_.stream);
      out += send_counts[p] * element;
      in += recv_counts[p] * element;
    }
    const ncclResult_t ended = ncclGroupEnd();  // the group ends whatever a call said
    nccl_ok(queued, "ncclSend/ncclRecv");
    settle(collectives_, ended, "ncclGroupEnd", CommOp::all_to_all, sent);
    return finished(collectives_, CommOp::all_to_all, sent);
  }
  void broadcast(std::span<float> data, int root) override {
    last_started_ = count_started(CommOp::broadcast, data.size_bytes(), watchdog_->step);
    float* device = stage_in(data.data(), data.size_bytes());
    after_compute(collectives_);
    settle(collectives_,
           ncclBroadcast(device, device, data.size(), ncclFloat32, root, collectives_.comm, collectives_.stream),
           "ncclBroadcast", CommOp::broadcast, data.size());
    finished_staged(CommOp::broadcast, data.size(), data.data(), device, data.size_bytes())->wait();
  }
  void barrier() override {
    last_started_ = count_started(CommOp::barrier, 0, watchdog_->step);
    group_->barrier();
  }
  // Host bytes travel over the group's MPI communicator.
  RequestPtr send_async(std::span<const std::byte> data, int peer, int tag) override {
    return group_->send_async(data, peer, tag);
  }
  RequestPtr recv_async(std::span<std::byte> data, int peer, int tag) override {
    return group_->recv_async(data, peer, tag);
  }
  void broadcast(std::span<std::byte> data, int root) override { group_->broadcast(data, root); }

 private:
  RequestPtr all_reduce(void* data, size_t count, size_t bytes, ncclDataType_t type, ReduceOp op) {
    last_started_ = count_started(CommOp::all_reduce, bytes, watchdog_->step);
    void* device = stage_in(data, bytes);
    after_compute(collectives_);
    settle(collectives_, ncclAllReduce(device, device, count, type, nccl_op(op), collectives_.comm, collectives_.stream),
           "ncclAllReduce", CommOp::all_reduce, count);
    return finished_staged(CommOp::all_reduce, count, data, device, bytes);
  }
  // NCCL matches point-to-point calls by their order per channel, not by tag: the
  // pipeline issues each direction's transfers between two stages in the same order on
  // both sides.
  RequestPtr send(const void* data, size_t count, size_t bytes, ncclDataType_t type, int peer, int /*tag*/) {
    check(!on_host(data), "NCCL send needs a device buffer");
    last_started_ = count_started(CommOp::send, bytes, watchdog_->step);
    Channel& c = channel_to(peer);
    after_compute(c);
    NCCL_CHECK(ncclGroupStart());
    const ncclResult_t queued = ncclSend(data, count, type, peer, c.comm, c.stream);
    const ncclResult_t ended = ncclGroupEnd();  // the group ends whatever the send said
    nccl_ok(queued, "ncclSend");
    settle(c, ended, "ncclGroupEnd", CommOp::send, count, peer);
    return finished(c, CommOp::send, count);
  }
  RequestPtr recv(void* data, size_t count, size_t bytes, ncclDataType_t type, int peer, int /*tag*/) {
    check(!on_host(data), "NCCL recv needs a device buffer");
    last_started_ = count_started(CommOp::recv, bytes, watchdog_->step);
    Channel& c = channel_from(peer);
    after_compute(c);
    NCCL_CHECK(ncclGroupStart());
    const ncclResult_t queued = ncclRecv(data, count, type, peer, c.comm, c.stream);
    const ncclResult_t ended = ncclGroupEnd();
    nccl_ok(queued, "ncclRecv");
    settle(c, ended, "ncclGroupEnd", CommOp::recv, count, peer);
    return finished(c, CommOp::recv, count);
  }

  // One NCCL communicator over the group and the stream its operations run on.
  struct Channel {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
  };
  Channel make_channel() {
    ncclUniqueId id;
    if (group_->rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    group_->broadcast(std::as_writable_bytes(std::span(&id, 1)), 0);  // bounded, as every wait
    Channel c;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    last_started_ = count_started(CommOp::connect, 0, watchdog_->step);
    settle(c, ncclCommInitRankConfig(&c.comm, group_->size(), id, group_->rank(), &config), "ncclCommInitRankConfig",
           CommOp::connect, 0);
    last_started_ = 0;
    return c;
  }
  // Makes every connection now: a one-float all-reduce over the group, and on the
  // pipeline's channels one message from each rank to the next (towards higher ranks) and
  // back (towards lower), as the schedule's first transfers would; each waited for, bounded.
  void connect() {
    last_started_ = count_started(CommOp::connect, sizeof(float), watchdog_->step);
    settle(collectives_, ncclAllReduce(probe_, probe_, 1, ncclFloat32, ncclSum, collectives_.comm, collectives_.stream),
           "ncclAllReduce", CommOp::connect, 1);
    finished(collectives_, CommOp::connect, 1)->wait();
    for (Channel* c : {&towards_higher_, &towards_lower_}) {
      if (c->comm == nullptr) continue;
      const int to = c == &towards_higher_ ? rank() + 1 : rank() - 1, from = c == &towards_higher_ ? rank() - 1 : rank() + 1;
      last_started_ = count_started(CommOp::connect, sizeof(float), watchdog_->step);
      NCCL_CHECK(ncclGroupStart());
      ncclResult_t queued = ncclSuccess;
      if (to >= 0 && to < size()) queued = ncclSend(probe_, 1, ncclFloat32, to, c->comm, c->stream);
      if (queued == ncclSuccess && from >= 0 && from < size())
        queued = ncclRecv(probe_ + 1, 1, ncclFloat32, from, c->comm, c->stream);
      const ncclResult_t ended = ncclGroupEnd();
      nccl_ok(queued, "ncclSend/ncclRecv");
      settle(*c, ended, "ncclGroupEnd", CommOp::connect, 1);
      finished(*c, CommOp::connect, 1)->wait();
    }
  }
  // A non-blocking communicator answers ncclInProgress while it waits for its peers (its
  // set-up, a connection): wait until it is done, bounded by the watchdog, naming the
  // members that had not come (the board's numbers; peer: the other side of a transfer).
  void settle(const Channel& c, ncclResult_t result, const char* call, CommOp op, size_t count, int peer = -1) {
    nccl_ok(result, call);
    if (result != ncclInProgress) return;
    wait_bounded(
        [&] {
          ncclResult_t state = ncclSuccess;
          nccl_ok(ncclCommGetAsyncError(c.comm, &state), "ncclCommGetAsyncError");
          nccl_ok(state, call);
          return state != ncclInProgress;
        },
        "NCCL ", op, count, *this, *watchdog_, [this] { abort_all(); }, last_started_, peer);
  }
  // Lets the channel's work finish, then finalizes (flushes) its communicator and frees
  // it, every wait bounded by the watchdog; a communicator in error, or one that does not
  // finish in time (a peer gone), is aborted instead. A destructor's: never throws.
  void close(Channel& c) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::duration<double>(watchdog_->timeout_s);
    const auto in_time = [&] { return std::chrono::steady_clock::now() < give_up; };
    ncclResult_t state = ncclSuccess;
    bool healthy = ncclCommGetAsyncError(c.comm, &state) == ncclSuccess && state == ncclSuccess;
    while (healthy && cudaStreamQuery(c.stream) == cudaErrorNotReady)
      if (!in_time()) healthy = false;
    if (healthy) {
      state = ncclCommFinalize(c.comm);
      while (state == ncclInProgress && in_time())
        if (ncclCommGetAsyncError(c.comm, &state) != ncclSuccess) break;
    }
    if (healthy && state == ncclSuccess) ncclCommDestroy(c.comm);
    else ncclCommAbort(c.comm);
    c.comm = nullptr;
  }
  // Data from a lower rank travels towards higher ranks, and the other way round.
  Channel& channel_from(int peer) {
    Channel& c = peer < rank() ? towards_higher_ : towards_lower_;
    check(c.comm != nullptr, "NCCL: point-to-point on the " + name() + " group, made without it");
    return c;
  }
  Channel& channel_to(int peer) {
    Channel& c = peer > rank() ? towards_higher_ : towards_lower_;
    check(c.comm != nullptr, "NCCL: point-to-point on the " + name() + " group, made without it");
    return c;
  }

  // The channel's stream waits for everything issued to the compute stream so far.
  void after_compute(const Channel& c) {
    CUDA_CHECK(cudaEventRecord(ready_, kernels::cuda::compute_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(c.stream, ready_, 0));
  }
  RequestPtr finished(const Channel& c, CommOp op, size_t count, void* host_out = nullptr,
                      const void* staged = nullptr, size_t bytes = 0) {
    cudaEvent_t done;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, c.stream));
    return std::make_unique<NcclRequest>(*this, c.comm, op, count, std::exchange(last_started_, 0), done, host_out,
                                         staged, bytes);
  }
  // A collective on `data`, which ran on `device`: a staging copy when they differ.
  RequestPtr finished_staged(CommOp op, size_t count, void* data, void* device, size_t bytes) {
    if (device == data) return finished(collectives_, op, count);
    return finished(collectives_, op, count, data, device, bytes);
  }
  // A device copy of a host buffer (the buffer itself when it is device memory).
  template <typename E>
  E* stage_in(E* data, size_t bytes) {
    if (!on_host(data)) return data;
    check(!staged_in_use_, "NCCL: one host-memory operation at a time per communicator");
    if (bytes > staging_bytes_) {
      if (staging_ != nullptr) CUDA_CHECK(cudaFree(staging_));
      CUDA_CHECK(cudaMalloc(&staging_, bytes));
      staging_bytes_ = bytes;
    }
    CUDA_CHECK(cudaMemcpyAsync(staging_, data, bytes, cudaMemcpyHostToDevice, collectives_.stream));
    staged_in_use_ = true;
    return static_cast<E*>(staging_);
  }

  friend class NcclRequest;
  uint64_t last_started_ = 0;  // count_started()'s number for the request finished() makes next
  std::unique_ptr<MpiCommunicator> group_;
  std::shared_ptr<Watchdog> watchdog_;
  Channel collectives_, towards_higher_, towards_lower_;
  cudaEvent_t ready_ = nullptr;
  float* probe_ = nullptr;  // two floats for connect()'s messages
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  bool staged_in_use_ = false;
};

bool NcclRequest::test() {
  if (complete_) return true;
  const cudaError_t state = cudaEventQuery(done_);
  if (state == cudaSuccess) {
    completed();
    return true;
  }
  if (state != cudaErrorNotReady) CUDA_CHECK(state);
  ncclResult_t async_error = ncclSuccess;
  NCCL_CHECK(ncclCommGetAsyncError(nccl_, &async_error));
  if (async_error != ncclSuccess && async_error != ncclInProgress)
    fail(std::string("NCCL: ") + comm_op_name(op_) + " on the " + comm_.name() +
         " group failed: " + ncclGetErrorString(async_error));
  return false;
}

void NcclRequest::wait() {
  // On a timeout, abort NCCL first: that frees the GPU from the stuck kernels.
  wait_bounded([this] { return test(); }, "NCCL ", op_, count_, comm_, comm_.watchdog(), [this] { comm_.abort_all(); },
               seq_);
}

void NcclRequest::completed() {
  complete_ = true;
  if (staged_ == nullptr) return;
  if (host_out_ != nullptr) CUDA_CHECK(cudaMemcpy(host_out_, staged_, bytes_, cudaMemcpyDeviceToHost));
  comm_.staged_in_use_ = false;
}

}  // namespace

bool nccl_compiled_in() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<MpiCommunicator> group,
                                                     std::shared_ptr<Watchdog> watchdog, bool point_to_point) {
  return std::make_unique<NcclCommunicator>(std::move(group), std::move(watchdog), point_to_point);
}

}  // namespace trident

#else  // no NCCL in this build

namespace trident {

bool nccl_compiled_in() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<MpiCommunicator> group,
                                                     std::shared_ptr<Watchdog>, bool) {
  throw UsageError("the " + group->name() +
                   " group needs NCCL, which this build lacks (rebuild with NCCL_HOME=/path/to/nccl)");
}

}  // namespace trident

#endif
