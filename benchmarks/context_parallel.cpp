// Context parallelism (parallel.cp = P, ring attention) on one attention layer: the time
// of forward + backward per rank, the attention memory per rank and the bytes each rank
// sends, for T = 4K .. 32K tokens per sequence.
//
//   mpirun --oversubscribe -np P -x OMP_NUM_THREADS=1 build/bench/context_parallel [--T=4096,8192] [--reps=N]
//
// The layer: Llama-like grouped-query attention, 8 query heads, 2 key/value heads, head
// dimension 64, one sequence (B = 1), causal, fp32, the CPU kernels (make_cpu_kernels).
// P > 1: RingAttention::forward and ::backward over the cp communicator of a
// ParallelState of cp = P (MPI), each rank holding chunks i and 2P-1-i of the sequence;
// P = 1: the same kernels called directly (Kernels::attention_forward/backward, positions
// 0..T-1), what the model runs without context parallelism.
//
// Against what:
//  - time: the layer's causal attention FLOPs (forward 2 T^2 NH HD: QK^T and PV over half
//    the T x T scores; backward 5 T^2 NH HD: the scores again, dV, dP, dQ, dK), 1/P of
//    them per rank, as a rate beside the GEMM rate this rank measures in the same run
//    (Kernels::measure_gemm_gflops, n = 1024): the physical limit of the kernels' GEMMs.
//  - memory: counted from the shapes (fp32): kept for backward per layer, qkv [T/P, (NH +
//    2 NKV) HD] + out [T/P, NH HD] + lse [NH, T/P]; the ring's buffers (RingBuffers, once
//    per model, shared by the layers): six key/value blocks (two to send and receive,
//    two gradient sums going out, one coming in, one block's part), a block's output,
//    log-sum-exps and dq. And the whole activation arena of a model (measure_activations
//    of activation_shape(..., context_parallel = P), no allocation) of 8 such
//    layers (Llama, d 512, vocabulary 32000, micro-batch 1, no recompute): it should fall
//    as 1/P, the ring's buffers aside.
//  - volume: bytes of CommOp::send counted by this rank's cp communicator, beside the
//    formula from RingAttention's code, per layer, with one block = B T/P 2 NKV HD
//    elements: forward P-1 blocks (the key/value blocks go round, none after the last
//    step); backward P-1 key/value blocks again plus P gradient sums (one each step: at
//    step s the sum for block me-s goes on to the next rank; after the last step every
//    block's sum has reached its owner), 2P-1 blocks. The receives mirror the sends.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "kernels/base/memory.h"
#include "kernels/device_buffer.h"
#include "kernels/kernels.h"
#include "model/activations.h"
#include "model/context_parallel.h"
#include "model/parameters.h"
#include "model/transformer.h"
#include "parallel/mpi_world.h"
#include "parallel/parallel_state.h"
#include "runtime/random.h"
#include "runtime/timer.h"

using namespace trident;
using kernels::Act;
using kernels::DeviceBuffer;

namespace {

constexpr int B = 1, NH = 8, NKV = 2, HD = 64;
constexpr int kQkvWidth = (NH + 2 * NKV) * HD, kOutWidth = NH * HD, kKvWidth = 2 * NKV * HD;

Act* act(DeviceBuffer& b) { return reinterpret_cast<Act*>(b.data()); }

// Uniform values in [-1, 1), the same for a position whatever rank holds it.
void fill(DeviceBuffer& buffer, const std::vector<int32_t>& positions, int width, uint64_t stream) {
  float* x = buffer.data();
  for (size_t t = 0; t < positions.size(); t++)
    for (int c = 0; c < width; c++) {
      const uint64_t h = hash_key(7, stream, static_cast<uint64_t>(positions[t]) * width + c);
      x[t * width + c] = static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-52 - 1.0);
    }
}

struct Row {
  int T = 0;
  double forward_s = 0, backward_s = 0;  // per rank, the slowest rank's, mean over repetitions
  double gemm_gflops = 0;                // this rank's GEMM rate, mean over ranks
  size_t kept_bytes = 0, ring_bytes = 0, arena_bytes = 0;
  uint64_t sent_forward = 0, sent_backward = 0, sends_forward = 0, sends_backward = 0;
  uint64_t received = 0;
  bool same_on_every_rank = true;  // the counts above are rank 0's; every rank's equal?
};

// The activation arena of an 8-layer Llama of these heads at sequence length T, on one
// rank of cp = P: measured, never allocated.
size_t arena_bytes(const kernels::Footprint& k, int T, int P) {
  ModelConfig mc;
  mc.family = "llama";
  mc.n_layer = 8;
  mc.n_head = NH;
  mc.n_kv_head = NKV;
  mc.d_model = NH * HD;
  mc.seq_len = T;
  mc.vocab_size = 32000;
  const TransformerSpec spec = transformer_spec(mc);
  return measure_activations(spec, {}, 0, 1, activation_shape(spec, {}, B, 1, Recompute::none, k, 1, false, P))
      .bytes.total();
}

Row run(ParallelState& parallel, kernels::Kernels& k, int T, int reps, bool warm_up) {
  Communicator& cp = parallel.cp();
  const int P = cp.size(), me = cp.rank(), Tl = T / P;
  const size_t rows = static_cast<size_t>(B) * Tl;
  const size_t stats = k.attention_stats_floats(B, Tl, NH);
  // Every rank's positions [P, Tl]; this rank's rows are its own.
  const std::vector<int32_t> every_rank = context_positions_of_every_rank(T, P);
  const std::vector<int32_t> mine = context_positions(T, P, me);
  DeviceBuffer positions(k, every_rank.size());
  k.copy_to_device(positions.data(), every_rank.data(), every_rank.size() * sizeof(int32_t));
  const int32_t* my_positions = reinterpret_cast<const int32_t*>(positions.data()) + static_cast<size_t>(me) * Tl;

  DeviceBuffer qkv(k, rows * kQkvWidth), out(k, rows * kOutWidth), lse(k, stats), dout(k, rows * kOutWidth),
      dqkv(k, rows * kQkvWidth);
  fill(qkv, mine, kQkvWidth, 1);
  fill(dout, mine, kOutWidth, 2);
  Row row;
  row.T = T;
  row.kept_bytes = (rows * kQkvWidth + rows * kOutWidth + stats) * sizeof(float);

  // The ring's buffers, laid out as the activation arena lays them (RingBuffers::lay_out).
  std::vector<DeviceBuffer> ring_memory;
  RingBuffers ring;
  std::unique_ptr<RingAttention> attention;
  if (P > 1) {
    const auto take = [&](size_t floats) {  // fp32: an element is a float
      ring_memory.emplace_back(k, floats);
      row.ring_bytes += floats * sizeof(float);
      return ring_memory.back().data();
    };
    ring.lay_out(
        rows, kQkvWidth, kOutWidth, stats, [&](Act*& p, size_t n) { p = reinterpret_cast<Act*>(take(n)); },
        [&](float*& p, size_t n) { p = take(n); });
    attention = std::make_unique<RingAttention>(k, cp, reinterpret_cast<const int32_t*>(positions.data()), Tl, NH, NKV,
                                                HD);
  }
  const kernels::AttentionMask mask{my_positions, my_positions, nullptr};
  const size_t kv_column = static_cast<size_t>(NH) * HD;
  const auto forward = [&] {
    if (attention) return attention->forward(act(out), lse.data(), act(qkv), mask, B, ring);
    k.attention_forward(act(out), lse.data(), act(qkv), kernels::offset(act(qkv), kv_column, k.activation_type()),
                        kQkvWidth, mask, B, T, T, NH, NKV, HD);
  };
  const auto backward = [&] {
    if (attention) return attention->backward(act(dqkv), act(dout), act(qkv), act(out), lse.data(), mask, B, ring);
    k.attention_backward(act(dqkv), kernels::offset(act(dqkv), kv_column, k.activation_type()), act(dout), act(qkv),
                         kernels::offset(act(qkv), kv_column, k.activation_type()), kQkvWidth, act(out), lse.data(),
                         mask, B, T, T, NH, NKV, HD);
  };

  if (warm_up) {  // the kernels' first call (oneDNN's code generation, their scratch)
    forward();
    backward();
  }
  double forward_s = 0, backward_s = 0;
  for (int rep = 0; rep < reps; rep++) {
    cp.reset_stats();
    parallel.world().barrier();
    Timer timer;
    forward();
    const double f = timer.seconds();
    const CommStats after_forward = cp.stats();
    backward();
    const double b = timer.seconds() - f;
    const CommStats& s = cp.stats();
    const int send = static_cast<int>(CommOp::send), recv = static_cast<int>(CommOp::recv);
    row.sent_forward = after_forward.bytes[send];
    row.sends_forward = after_forward.calls[send];
    row.sent_backward = s.bytes[send] - after_forward.bytes[send];
    row.sends_backward = s.calls[send] - after_forward.calls[send];
    row.received = s.bytes[recv];
    double mine_s[2] = {f, b}, slowest[2] = {};
    MPI_Allreduce(mine_s, slowest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    forward_s += slowest[0];
    backward_s += slowest[1];
  }
  const unsigned long long counts[4] = {row.sent_forward, row.sent_backward, row.received,
                                        row.sends_forward + row.sends_backward};
  unsigned long long low[4] = {}, high[4] = {};
  MPI_Allreduce(counts, low, 4, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(counts, high, 4, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  row.same_on_every_rank = std::equal(low, low + 4, high);
  row.forward_s = forward_s / reps;
  row.backward_s = backward_s / reps;
  row.arena_bytes = arena_bytes(k, T, P);
  return row;
}

double mib(double bytes) { return bytes / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory();
  MpiWorld world(&argc, &argv);
  std::vector<int> lengths = {4096, 8192, 16384, 32768};
  int reps = 0;  // 0: 3 below 8K tokens, 1 from there (a run of the table stays near 3 minutes)
  for (int i = 1; i < argc; i++) {
    if (!std::strncmp(argv[i], "--T=", 4)) lengths = bench::parse_int_list(argv[i] + 4);
    else if (!std::strncmp(argv[i], "--reps=", 7)) reps = std::atoi(argv[i] + 7);
    else {
      if (world.is_root()) std::fprintf(stderr, "usage: %s [--T=4096,8192,...] [--reps=N]\n", argv[0]);
      return 2;
    }
  }
  const int P = world.size();
  ParallelState parallel(ParallelDims::resolve(P, {{Axis::cp, P}}), 0, 600);
  auto k = kernels::make_cpu_kernels();
  // This rank's GEMM rate, all ranks measuring at once (as they compute at once).
  double gemm = k->measure_gemm_gflops(1024, 1.0), gemm_sum = 0;
  MPI_Allreduce(&gemm, &gemm_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  gemm = gemm_sum / P;

  std::vector<Row> table;
  for (int T : lengths) {
    if (T % (2 * P) != 0) {
      if (world.is_root()) std::fprintf(stderr, "T=%d is not a multiple of 2 cp = %d\n", T, 2 * P);
      return 2;
    }
    const int n = reps > 0 ? reps : (T < 8192 ? 3 : 1);
    table.push_back(run(parallel, *k, T, n, table.empty() || n > 1));  // 32K at cp 1: 2 min a pass
  }
  if (!world.is_root()) return 0;

  std::printf("cp = %d ranks; attention NH %d, NKV %d, HD %d, B %d, fp32; GEMM rate per rank %.1f GFLOP/s "
              "(n = 1024, all ranks at once); load average at the end: %s\n",
              P, NH, NKV, HD, B, gemm, bench::load_average().c_str());
  std::printf("(times: the slowest rank's, mean of the repetitions; counts: rank 0's, 'equal' also checks that every "
              "rank's are the same)\n\n");
  std::printf("| cp | T | tokens/rank | forward (ms) | backward (ms) | fwd+bwd (ms) | per token of T (us) | "
              "GFLOP/s per rank | / GEMM rate |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Row& r : table) {
    const double total = r.forward_s + r.backward_s;
    const double flops = 7.0 * r.T * r.T * NH * HD / P;  // causal: forward 2, backward 5 T^2 NH HD, 1/P each
    std::printf("| %d | %d | %d | %.1f | %.1f | %.1f | %.2f | %.1f | %.2f |\n", P, r.T, r.T / P, 1e3 * r.forward_s,
                1e3 * r.backward_s, 1e3 * total, 1e6 * total / r.T, flops / total / 1e9, flops / total / 1e9 / gemm);
  }
  std::printf("\n| cp | T | kept per layer (MiB) | ring buffers (MiB) | 8-layer arena (MiB) | sends fwd + bwd | "
              "sent fwd (bytes) | formula (P-1) blocks | sent bwd (bytes) | formula (2P-1) blocks | received | "
              "equal |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Row& r : table) {
    const uint64_t block_bytes = static_cast<uint64_t>(B) * (r.T / P) * kKvWidth * sizeof(float);
    const uint64_t forward = (P - 1) * block_bytes, backward = P > 1 ? (2 * P - 1) * block_bytes : 0;
    const bool equal = r.sent_forward == forward && r.sent_backward == backward &&
                       r.received == forward + backward && r.same_on_every_rank;
    std::printf("| %d | %d | %.2f | %.2f | %.1f | %llu + %llu | %llu | %llu | %llu | %llu | %llu | %s |\n", P, r.T,
                mib(r.kept_bytes), mib(r.ring_bytes), mib(r.arena_bytes),
                static_cast<unsigned long long>(r.sends_forward), static_cast<unsigned long long>(r.sends_backward),
                static_cast<unsigned long long>(r.sent_forward), static_cast<unsigned long long>(forward),
                static_cast<unsigned long long>(r.sent_backward), static_cast<unsigned long long>(backward),
                static_cast<unsigned long long>(r.received), equal ? "yes" : "NO");
  }
  return 0;
}
