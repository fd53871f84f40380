// The CUDA kernels against the CPU kernels, then timed.
//
// Part 1 runs every kernel of kernels/kernels.h on both backends with fresh random
// inputs (the same values on both: rounded to bf16 first when the GPU computes in bf16)
// and prints ||gpu - cpu|| / ||cpu|| per output. Tolerances: 1e-5 in fp32, 1e-2 in bf16;
// a NaN never passes. Part 2 times the GPU kernels at GPT-2 124M's shapes (batch 16 x
// 1024), with the flash attention against the naive three-kernel one, then the Llama
// kernels (RMSNorm, SwiGLU, rotary embeddings, grouped-query attention) at Llama-2-7B /
// Llama-3-8B shapes; a row that fails (an exception) is printed with its message and the
// next row runs.
//
// A CUDA fault (an illegal or misaligned address) is sticky: every later CUDA call of the
// process fails. The group that faulted is printed failed, the rest of that precision's
// groups are printed skipped, its timing table is not run, and the program goes on and
// ends with exit 1; benchmarks/gpu/check.sh runs each precision in a process of its own
// (bf16 first: the tensor-core attention that training uses) so that a fault in one
// leaves the other measured.
//
//   build/bench/kernel_check [--precision fp32|bf16] [--seed N] [--no-timing]
//       exit 1 when a check or timing row fails (default: bf16, then fp32)
//   build/bench/kernel_check --cpu-self-check            the CPU backend in place of the
//       GPU's (bf16 emulated): checks this program itself where there is no GPU, a
//       simulated fault included
//   --record PATH   writes which of grouped and per-expert GEMMs was faster for a mixture's
//       experts (the timing table's experts rows, per precision) to the JSON file PATH; a
//       run with TRIDENT_GPU_CHOICES=PATH follows it (kernels/grouped_gemm_choice.h)
//   --moe-router-memory   only the MoE router / dispatch kernels at N 16384, E 128, K 8,
//       C 2048 (bf16 unless --precision): checked against the CPU, timed, and FAIL where a
//       kernel's first run takes over 64 MiB of device memory (moe_router_memory() below)
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "benchmarks/gpu/faulty_kernels.h"
#include "kernels/bf16.h"
#include "kernels/cuda/naive_attention.h"
#include "kernels/grouped_gemm_choice.h"
#include "kernels/kernels.h"

#ifdef TRIDENT_CUDA
#include <cuda_runtime.h>
#endif

using namespace trident::kernels;

namespace {

#ifdef TRIDENT_CUDA
void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

// The current GPU's model, as the CUDA backend compares a record's (grouped_gemm_choice.h).
std::string device_model() {
#ifdef TRIDENT_CUDA
  int device = 0;
  cuda_ok(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return prop.name;
#else
  return "no GPU";
#endif
}

// Free device memory once the device is idle (what kernels reserve for themselves, their
// stacks say, shows as less free).
size_t device_free_bytes() {
#ifdef TRIDENT_CUDA
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  size_t free_bytes = 0, total = 0;
  cuda_ok(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  return free_bytes;
#else
  throw std::runtime_error("no CUDA in this build");
#endif
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); i++) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  const double e = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return std::isnan(e) ? INFINITY : e;
}

// Positions first, first + step, ... (n of them).
std::vector<int32_t> iota_positions(int n, int first, int step) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; i++) p[i] = first + i * step;
  return p;
}

// doc_start [B, T] of positions 0..T-1 packed with documents whose lengths are 1 +
// lengths[...] (random, one after the other), for the document mask.
std::vector<int32_t> random_documents(const std::vector<int32_t>& lengths, int B, int T) {
  std::vector<int32_t> starts(static_cast<size_t>(B) * T);
  size_t next_length = 0;
  for (int b = 0; b < B; b++)
    for (int i = 0, start = 0, end = 0; i < T; i++) {
      if (i >= end) start = i, end = i + 1 + lengths[next_length++ % lengths.size()];
      starts[static_cast<size_t>(b) * T + i] = start;
    }
  return starts;
}

// The first `width` columns of rows of `ld` elements.
std::vector<float> q_columns(const std::vector<float>& rows, int ld, size_t width) {
  std::vector<float> q;
  for (size_t r = 0; r + ld <= rows.size(); r += ld) q.insert(q.end(), rows.begin() + r, rows.begin() + r + width);
  return q;
}

// One precision's comparison: inputs are made on the host and copied to the GPU; the
// same host vectors are the CPU backend's buffers (its memory is the host's).
class Comparison {
 public:
  Comparison(Kernels& gpu, uint64_t seed) : gpu_(gpu), rng_(seed) {}
  Comparison(const Comparison&) = delete;
  ~Comparison() { release(); }

  bool bf16() const { return gpu_.precision() == Precision::bf16; }
  double tolerance() const { return bf16() ? 1e-2 : 1e-5; }

  // Random N(0, scale^2) values, representable in the GPU's activation type.
  std::vector<float> input(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = bf16() ? round_to_bf16(normal(rng_)) : normal(rng_);
    return v;
  }
  std::vector<int32_t> ids(size_t n, int below) {
    std::uniform_int_distribution<int32_t> pick(0, below - 1);
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = pick(rng_);
    return v;
  }

  Act* act(const std::vector<float>& host) {
    Act* p = static_cast<Act*>(keep(gpu_.alloc(gpu_.activation_bytes(host.size()))));
    gpu_.activations_from_host(p, host.data(), host.size());
    return p;
  }
  Act* act(size_t n) { return static_cast<Act*>(keep(gpu_.alloc(gpu_.activation_bytes(n)))); }
  float* f32(const std::vector<float>& host) {
    float* p = f32(host.size());
    gpu_.copy_to_device(p, host.data(), host.size() * sizeof(float));
    return p;
  }
  float* f32(size_t n) { return static_cast<float*>(keep(gpu_.alloc(n * sizeof(float)))); }
  int32_t* i32(const std::vector<int32_t>& host) {
    auto* p = static_cast<int32_t*>(keep(gpu_.alloc(host.size() * sizeof(int32_t))));
    gpu_.copy_to_device(p, host.data(), host.size() * sizeof(int32_t));
    return p;
  }
  std::vector<float> host(const Act* p, size_t n) {
    std::vector<float> v(n);
    gpu_.activations_to_host(v.data(), p, n);
    return v;
  }
  std::vector<float> host(const float* p, size_t n) {
    std::vector<float> v(n);
    gpu_.copy_to_host(v.data(), p, n * sizeof(float));
    return v;
  }

  // Records one output's error; `tolerance` < 0: the precision's default.
  void compare(const std::string& what, const std::vector<float>& gpu, const std::vector<float>& cpu,
               double tolerance = -1) {
    const double limit = tolerance >= 0 ? tolerance : this->tolerance();
    const double e = relative_error(gpu, cpu);
    const bool ok = e <= limit;
    failures_ += ok ? 0 : 1;
    std::printf("| %-38s | %-4s | %10.3e | %7.0e | %s |\n", what.c_str(), precision_name(gpu_.precision()), e, limit,
                ok ? "ok" : "FAIL");
  }
  // Frees the group's buffers; never throws. After a fault the device is gone: they
  // are left to the process's end.
  void release() noexcept {
    for (void* p : allocations_) {
      if (broken_) break;
      try {
        gpu_.free(p);
      } catch (const std::exception&) {
        broken_ = true;
      }
    }
    allocations_.clear();
  }
  // One group of checks. An exception (a CUDA error, say) counts as a failure and the
  // next group still runs, unless the device is broken (a sticky fault): then every
  // group after it is printed skipped.
  void run(const char* group, const std::function<void()>& checks) {
    if (broken_) {
      skipped_++;
      std::printf("| %-38s | %-4s | %10s | %7s | skipped: the device faulted above |\n", group,
                  precision_name(gpu_.precision()), "-", "");
      return;
    }
    try {
      checks();
    } catch (const std::exception& e) {
      failures_++;
      std::printf("| %-38s | %-4s | %10s | %7s | FAIL: %s |\n", group, precision_name(gpu_.precision()), "error", "",
                  e.what());
      try {  // an error of the call alone, or a fault every later call will see?
        gpu_.synchronize();
      } catch (const std::exception&) {
        broken_ = true;
      }
    }
    std::fflush(stdout);  // what was measured is on the page even if the process dies later
    release();
  }
  bool broken() const { return broken_; }
  int skipped() const { return skipped_; }
  int failures() const { return failures_; }

 private:
  void* keep(void* p) {
    allocations_.push_back(p);
    return p;
  }

  Kernels& gpu_;
  std::mt19937_64 rng_;
  std::vector<void*> allocations_;
  int failures_ = 0, skipped_ = 0;
  bool broken_ = false;
};

// Mixture of experts, E experts, top K, over B sequences of T tokens of width C; `mode` 0:
// renormalized softmax, 1: softmax, 2: renormalized sigmoid, 3: renormalized sigmoid with an
// expert bias (loss-free balancing) in the choice. The router's scores, top-k
// and logit gradient; the dispatch to rows grouped by expert and the weighted combine.
void check_moe(Kernels& cpu, Kernels& gpu, Comparison& c, int B, int T, int E, int K, int C, int mode) {
  const int N = B * T;
  const bool renormalize = mode != 1, sigmoid = mode >= 2, biased = mode == 3;
  const std::string at = " E=" + std::to_string(E) + " K=" + std::to_string(K) +
                         (renormalize ? " renormalized" : "") + (sigmoid ? " sigmoid" : "") + (biased ? " biased" : "");
  const auto logits = c.input(static_cast<size_t>(N) * E);
  const auto bias = c.input(static_cast<size_t>(E));
  std::vector<float> probs(static_cast<size_t>(N) * E), lse(N), weights(static_cast<size_t>(N) * K);
  std::vector<int32_t> experts(static_cast<size_t>(N) * K);
  float *g_probs = c.f32(probs.size()), *g_lse = c.f32(N), *g_weights = c.f32(weights.size());
  int32_t* g_experts = c.i32(experts);
  // The logits in fp32, as the router's matmul_forward_f32 leaves them.
  gpu.moe_router_forward(g_probs, g_lse, g_experts, g_weights, c.f32(logits), biased ? c.f32(bias) : nullptr, N, E,
                         K, renormalize, sigmoid);
  cpu.moe_router_forward(probs.data(), lse.data(), experts.data(), weights.data(), logits.data(),
                         biased ? bias.data() : nullptr, N, E, K, renormalize, sigmoid);
  c.compare("moe_router_forward probs" + at, c.host(g_probs, probs.size()), probs, 1e-5);
  c.compare("moe_router_forward lse" + at, c.host(g_lse, N), lse, 1e-5);
  c.compare("moe_router_forward weights" + at, c.host(g_weights, weights.size()), weights, 1e-5);
  std::vector<int32_t> chosen(experts.size());
  gpu.copy_to_host(chosen.data(), g_experts, chosen.size() * sizeof(int32_t));
  c.compare("moe_router_forward experts (exact)" + at, std::vector<float>(chosen.begin(), chosen.end()),
            std::vector<float>(experts.begin(), experts.end()), 0.0);
  // From the CPU's routing on both: the dropless permutation (exact) and the balance
  // loss's statistics, coefficients and value (kernels/cuda/moe_routing.cu).
  {
    const int32_t* g_chosen = c.i32(experts);
    std::vector<int32_t> permutation(experts.size(), -1), got(experts.size());
    std::vector<float> counts(E);
    int32_t* g_permutation = c.i32(permutation);
    float* g_counts = c.f32(E);
    gpu.moe_permute(g_permutation, g_counts, g_chosen, N * K, E);
    cpu.moe_permute(permutation.data(), counts.data(), experts.data(), N * K, E);
    gpu.copy_to_host(got.data(), g_permutation, got.size() * sizeof(int32_t));
    c.compare("moe_permute rows (exact)" + at, std::vector<float>(got.begin(), got.end()),
              std::vector<float>(permutation.begin(), permutation.end()), 0.0);
    c.compare("moe_permute counts (exact)" + at, c.host(g_counts, E), counts, 0.0);
    const size_t BE = static_cast<size_t>(B) * E;
    std::vector<float> stats(2 * BE), totals(N), coefficients(BE);
    float *g_stats = c.f32(stats.size()), *g_coefficients = c.f32(BE);
    auto* g_loss = reinterpret_cast<double*>(c.f32(2));  // zero-filled
    gpu.moe_balance_statistics(g_stats, c.f32(N), g_chosen, c.f32(probs), N, T, E, K, sigmoid);
    cpu.moe_balance_statistics(stats.data(), totals.data(), experts.data(), probs.data(), N, T, E, K, sigmoid);
    c.compare("moe_balance_statistics" + at, c.host(g_stats, stats.size()), stats, 1e-5);
    double loss = 0, g_loss_host = 0;
    gpu.moe_balance_loss(g_coefficients, g_loss, g_stats, c.f32(lse), B, N, E, K, T, 0.01, 0.001, true);
    cpu.moe_balance_loss(coefficients.data(), &loss, stats.data(), lse.data(), B, N, E, K, T, 0.01, 0.001, true);
    gpu.copy_to_host(&g_loss_host, g_loss, sizeof(double));
    c.compare("moe_balance_loss coefficients" + at, c.host(g_coefficients, BE), coefficients, 1e-5);
    c.compare("moe_balance_loss value" + at, {static_cast<float>(g_loss_host)}, {static_cast<float>(loss)}, 1e-5);
  }
  // Backward from the CPU's routing on both: the weights' gradient, balance and z-loss.
  const auto dweights = c.input(weights.size()), balance = c.input(static_cast<size_t>(B) * E);
  std::vector<float> dlogits(probs.size());
  Act* g_dlogits = c.act(dlogits.size());
  gpu.moe_router_backward(g_dlogits, c.f32(probs), c.f32(lse), c.i32(experts), c.f32(weights), c.f32(dweights),
                          c.f32(balance), T, 0.3f, 0.01f, N, E, K, renormalize, sigmoid);
  cpu.moe_router_backward(as_act(dlogits.data()), probs.data(), lse.data(), experts.data(), weights.data(),
                          dweights.data(), balance.data(), T, 0.3f, 0.01f, N, E, K, renormalize, sigmoid);
  c.compare("moe_router_backward dlogits" + at, c.host(g_dlogits, dlogits.size()), dlogits);
  // Rows: a random permutation of the N*K routed rows.
  std::vector<int32_t> rows(static_cast<size_t>(N) * K);
  for (size_t i = 0; i < rows.size(); i++) rows[i] = static_cast<int32_t>(i);
  std::shuffle(rows.begin(), rows.end(), std::mt19937(5));
  const int32_t* g_rows = c.i32(rows);
  const size_t routed_n = rows.size() * C, token_n = static_cast<size_t>(N) * C;
  const auto x = c.input(token_n), expert_out = c.input(routed_n), dout = c.input(token_n);
  std::vector<float> routed(routed_n), dx(token_n), out(token_n), dexpert_out(routed_n), dw(weights.size());
  Act *g_routed = c.act(routed_n), *g_dx = c.act(token_n), *g_out = c.act(token_n), *g_dexpert = c.act(routed_n);
  float* g_dw = c.f32(dw.size());
  gpu.moe_dispatch(g_routed, c.act(x), g_rows, N, K, C);
  cpu.moe_dispatch(as_act(routed.data()), as_act(x.data()), rows.data(), N, K, C);
  c.compare("moe_dispatch (exact)", c.host(g_routed, routed_n), routed, 0.0);
  gpu.moe_dispatch_backward(g_dx, c.act(expert_out), g_rows, N, K, C);
  cpu.moe_dispatch_backward(as_act(dx.data()), as_act(expert_out.data()), rows.data(), N, K, C);
  c.compare("moe_dispatch_backward dx", c.host(g_dx, token_n), dx);
  const float* g_w = c.f32(weights);
  gpu.moe_combine(g_out, c.act(expert_out), g_w, g_rows, N, K, C);
  cpu.moe_combine(as_act(out.data()), as_act(expert_out.data()), weights.data(), rows.data(), N, K, C);
  c.compare("moe_combine" + at, c.host(g_out, token_n), out);
  gpu.moe_combine_backward(g_dexpert, g_dw, c.act(dout), c.act(expert_out), g_w, g_rows, N, K, C);
  cpu.moe_combine_backward(as_act(dexpert_out.data()), dw.data(), as_act(dout.data()), as_act(expert_out.data()),
                           weights.data(), rows.data(), N, K, C);
  c.compare("moe_combine_backward dexpert_out" + at, c.host(g_dexpert, routed_n), dexpert_out);
  c.compare("moe_combine_backward dweights" + at, c.host(g_dw, dw.size()), dw);
}

void check_all(Kernels& cpu, Kernels& gpu, Comparison& c) {
  const int B = 2, T = 200, C = 256, N = B * T;  // T not a multiple of any tile
  c.run("cast_to_activation", [&] {  // the compute copy of the weights: bit-exact round to nearest even
    std::vector<float> master(4096);
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& x : master) x = normal(rng);
    Act* g = c.act(master.size());
    gpu.cast_to_activation(g, c.f32(master), master.size());
    std::vector<float> want(master);
    if (c.bf16())
      for (float& x : want) x = round_to_bf16(x);
    c.compare("cast_to_activation (exact)", c.host(g, master.size()), want, 0.0);
  });
  c.run("embeddings", [&] {  // a vocabulary shard [64, 264) of 300 ids
    const int start = 64, rows = 200;
    const auto tokens = c.ids(N, 300);
    auto wte = c.input(static_cast<size_t>(rows) * C), wpe = c.input(static_cast<size_t>(T) * C);
    std::vector<float> out(static_cast<size_t>(N) * C);
    Act* g_out = c.act(out.size());
    int32_t* g_tokens = c.i32(tokens);
    gpu.embedding_forward(g_out, g_tokens, c.act(wte), start, rows, B, T, C);
    cpu.embedding_forward(as_act(out.data()), tokens.data(), as_act(wte.data()), start, rows, B, T, C);
    c.compare("embedding_forward", c.host(g_out, out.size()), out);
    std::vector<int32_t> positions(T);  // reversed: a context-parallel rank's rows are not 0..T-1 either
    for (int t = 0; t < T; t++) positions[t] = T - 1 - t;
    const int32_t* g_positions = c.i32(positions);
    gpu.add_positions(g_out, c.act(wpe), g_positions, B, T, C);
    cpu.add_positions(as_act(out.data()), as_act(wpe.data()), positions.data(), B, T, C);
    c.compare("add_positions", c.host(g_out, out.size()), out);
    const auto dout = c.input(out.size());
    auto dwte = c.input(wte.size()), dwpe = c.input(wpe.size());
    float *g_dwte = c.f32(dwte), *g_dwpe = c.f32(dwpe);
    Act* g_dout = c.act(dout);
    gpu.embedding_backward(g_dwte, g_dout, g_tokens, tokens.data(), start, rows, B, T, C);
    cpu.embedding_backward(dwte.data(), as_act(dout.data()), tokens.data(), tokens.data(), start, rows, B, T, C);
    c.compare("embedding_backward (dwte +=)", c.host(g_dwte, dwte.size()), dwte);
    gpu.positions_backward(g_dwpe, g_dout, g_positions, B, T, C);
    cpu.positions_backward(dwpe.data(), as_act(dout.data()), positions.data(), B, T, C);
    c.compare("positions_backward (dwpe +=)", c.host(g_dwpe, dwpe.size()), dwpe);
  });
  for (int width : {256, 1600}) c.run("layernorm", [&] {  // LayerNorm; 1600 (GPT-2 XL): 50 columns per lane, not a multiple of 32
    const int rows = width == 256 ? N : 64;
    const size_t n = static_cast<size_t>(rows) * width;
    const auto inp = c.input(n, 2.0f), weight = c.input(width), bias = c.input(width), dout = c.input(n);
    auto dinp = c.input(n), dweight = c.input(width), dbias = c.input(width);
    std::vector<float> out(n), mean(rows), rstd(rows);
    Act *g_out = c.act(n), *g_inp = c.act(inp), *g_weight = c.act(weight), *g_dinp = c.act(dinp);
    float *g_mean = c.f32(rows), *g_rstd = c.f32(rows), *g_dweight = c.f32(dweight), *g_dbias = c.f32(dbias);
    gpu.layernorm_forward(g_out, g_mean, g_rstd, g_inp, g_weight, c.act(bias), rows, width, 1e-5f);
    cpu.layernorm_forward(as_act(out.data()), mean.data(), rstd.data(), as_act(inp.data()), as_act(weight.data()),
                          as_act(bias.data()), rows, width, 1e-5f);
    const std::string at = " C=" + std::to_string(width);
    c.compare("layernorm_forward out" + at, c.host(g_out, n), out);
    c.compare("layernorm_forward mean" + at, c.host(g_mean, rows), mean, 1e-5);
    c.compare("layernorm_forward rstd" + at, c.host(g_rstd, rows), rstd, 1e-5);
    gpu.layernorm_backward(g_dinp, g_dweight, g_dbias, c.act(dout), g_inp, g_weight, g_mean, g_rstd, rows, width);
    cpu.layernorm_backward(as_act(dinp.data()), dweight.data(), dbias.data(), as_act(dout.data()),
                           as_act(inp.data()), as_act(weight.data()), mean.data(), rstd.data(), rows, width);
    c.compare("layernorm_backward dinp +=" + at, c.host(g_dinp, n), dinp);
    c.compare("layernorm_backward dweight +=" + at, c.host(g_dweight, width), dweight);
    c.compare("layernorm_backward dbias +=" + at, c.host(g_dbias, width), dbias);
  });
  for (int width : {256, 1600}) c.run("rmsnorm", [&] {  // RMSNorm; as LayerNorm above
    const int rows = width == 256 ? N : 64;
    const size_t n = static_cast<size_t>(rows) * width;
    const auto inp = c.input(n, 2.0f), weight = c.input(width), dout = c.input(n);
    auto dinp = c.input(n), dweight = c.input(width);
    std::vector<float> out(n), rstd(rows);
    Act *g_out = c.act(n), *g_inp = c.act(inp), *g_weight = c.act(weight), *g_dinp = c.act(dinp);
    float *g_rstd = c.f32(rows), *g_dweight = c.f32(dweight);
    gpu.rmsnorm_forward(g_out, g_rstd, g_inp, g_weight, rows, width, 1e-5f);
    cpu.rmsnorm_forward(as_act(out.data()), rstd.data(), as_act(inp.data()), as_act(weight.data()), rows, width, 1e-5f);
    const std::string at = " C=" + std::to_string(width);
    c.compare("rmsnorm_forward out" + at, c.host(g_out, n), out);
    c.compare("rmsnorm_forward rstd" + at, c.host(g_rstd, rows), rstd, 1e-5);
    gpu.rmsnorm_backward(g_dinp, g_dweight, c.act(dout), g_inp, g_weight, g_rstd, rows, width);
    cpu.rmsnorm_backward(as_act(dinp.data()), dweight.data(), as_act(dout.data()), as_act(inp.data()),
                         as_act(weight.data()), rstd.data(), rows, width);
    c.compare("rmsnorm_backward dinp +=" + at, c.host(g_dinp, n), dinp);
    c.compare("rmsnorm_backward dweight +=" + at, c.host(g_dweight, width), dweight);
  });
  // Rotary embeddings on the q and k heads of qkv rows (v stays as it is): grouped-query
  // layouts, head dims 32 and 128.
  for (const auto& [NH, NKV, HD] : std::vector<std::tuple<int, int, int>>{{8, 2, 32}, {4, 1, 128}}) c.run("rope", [&] {
    const size_t n = static_cast<size_t>(N) * (NH + 2 * NKV) * HD;
    std::vector<float> table(static_cast<size_t>(T) * HD);  // [T][HD/2][cos, sin], theta 10000
    for (int t = 0; t < T; t++)
      for (int i = 0; i < HD / 2; i++) {
        const double angle = t * std::pow(10000.0, -2.0 * i / HD);
        table[(static_cast<size_t>(t) * HD / 2 + i) * 2] = static_cast<float>(std::cos(angle));
        table[(static_cast<size_t>(t) * HD / 2 + i) * 2 + 1] = static_cast<float>(std::sin(angle));
      }
    auto qkv = c.input(n), dqkv = c.input(n);
    Act *g_qkv = c.act(qkv), *g_dqkv = c.act(dqkv);
    float* g_table = c.f32(table);
    const std::string at = " hd=" + std::to_string(HD) + " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV);
    gpu.rope_forward(g_qkv, g_table, B, T, NH, NKV, HD);
    cpu.rope_forward(as_act(qkv.data()), table.data(), B, T, NH, NKV, HD);
    c.compare("rope_forward qkv" + at, c.host(g_qkv, n), qkv);
    gpu.rope_backward(g_dqkv, g_table, B, T, NH, NKV, HD);
    cpu.rope_backward(as_act(dqkv.data()), table.data(), B, T, NH, NKV, HD);
    c.compare("rope_backward dqkv" + at, c.host(g_dqkv, n), dqkv);
  });
  c.run("swiglu", [&] {  // F = 300: not a multiple of a block
    const int F = 300;
    const size_t n = static_cast<size_t>(N) * F;
    const auto gate_up = c.input(2 * n, 2.0f), dout = c.input(n);
    std::vector<float> out(n), dgate_up(2 * n);
    Act *g_out = c.act(n), *g_gate_up = c.act(gate_up), *g_dgate_up = c.act(2 * n);
    gpu.swiglu_forward(g_out, g_gate_up, N, F);
    cpu.swiglu_forward(as_act(out.data()), as_act(gate_up.data()), N, F);
    c.compare("swiglu_forward F=300", c.host(g_out, n), out);
    gpu.swiglu_backward(g_dgate_up, g_gate_up, c.act(dout), N, F);
    cpu.swiglu_backward(as_act(dgate_up.data()), as_act(gate_up.data()), as_act(dout.data()), N, F);
    c.compare("swiglu_backward dgate_up F=300", c.host(g_dgate_up, 2 * n), dgate_up);
  });
  // Mixture of experts (8 experts, top-2, renormalized and not, softmax and sigmoid scores).
  for (int mode = 0; mode < 4; mode++) c.run("moe", [&] { check_moe(cpu, gpu, c, B, T, 8, 2, C, mode); });
  // Matmuls: an aligned shape and an odd one (cuBLASLt picks other algorithms).
  for (const auto& [rows, in, outc] : std::vector<std::tuple<int, int, int>>{{N, C, 3 * C}, {301, 203, 333}}) c.run("matmul", [&] {
    const size_t n_in = static_cast<size_t>(rows) * in, n_out = static_cast<size_t>(rows) * outc;
    const auto inp = c.input(n_in), weight = c.input(static_cast<size_t>(outc) * in, 0.05f), bias = c.input(outc);
    std::vector<float> out(n_out), dinp(n_in);
    Act *g_out = c.act(n_out), *g_inp = c.act(inp), *g_weight = c.act(weight);
    const std::string at =
        std::string(" ") + std::to_string(rows) + "x" + std::to_string(in) + "x" + std::to_string(outc);
    gpu.matmul_forward(g_out, g_inp, g_weight, c.act(bias), rows, in, outc);
    cpu.matmul_forward(as_act(out.data()), as_act(inp.data()), as_act(weight.data()), as_act(bias.data()), rows, in,
                       outc);
    c.compare("matmul_forward +bias" + at, c.host(g_out, n_out), out);
    gpu.matmul_forward(g_out, g_inp, g_weight, nullptr, rows, in, outc);
    cpu.matmul_forward(as_act(out.data()), as_act(inp.data()), as_act(weight.data()), nullptr, rows, in, outc);
    c.compare("matmul_forward" + at, c.host(g_out, n_out), out);
    {  // fp32 out (a router's logits): no rounding to the activation type on either side
      std::vector<float> out_f32(n_out);
      float* g_out_f32 = c.f32(n_out);
      gpu.matmul_forward_f32(g_out_f32, g_inp, g_weight, rows, in, outc);
      cpu.matmul_forward_f32(out_f32.data(), as_act(inp.data()), as_act(weight.data()), rows, in, outc);
      c.compare("matmul_forward_f32" + at, c.host(g_out_f32, n_out), out_f32);
    }
    const auto dout = c.input(n_out);
    auto dweight = c.input(weight.size()), dbias = c.input(outc);
    Act* g_dinp = c.act(n_in);
    float *g_dweight = c.f32(dweight), *g_dbias = c.f32(dbias);
    gpu.matmul_backward(g_dinp, g_dweight, g_dbias, c.act(dout), g_inp, g_weight, rows, in, outc);
    cpu.matmul_backward(as_act(dinp.data()), dweight.data(), dbias.data(), as_act(dout.data()), as_act(inp.data()),
                        as_act(weight.data()), rows, in, outc);
    c.compare("matmul_backward dinp" + at, c.host(g_dinp, n_in), dinp);
    c.compare("matmul_backward dweight +=" + at, c.host(g_dweight, dweight.size()), dweight);
    c.compare("matmul_backward dbias +=" + at, c.host(g_dbias, outc), dbias);
  });
  // The experts' grouped GEMMs (cuBLAS's grouped batched GEMM on the GPU, one matmul per
  // group on the CPU): uneven groups, empty ones among them, an odd width.
  for (const auto& [in, outc] : std::vector<std::pair<int, int>>{{C, 2 * C}, {203, 333}}) c.run("grouped matmul", [&] {
    const std::vector<int> rows = {37, 0, 64, 5, 0, 130};
    const int groups = static_cast<int>(rows.size());
    int total = 0;
    for (int r : rows) total += r;
    const size_t n_in = static_cast<size_t>(total) * in, n_out = static_cast<size_t>(total) * outc,
                 n_w = static_cast<size_t>(outc) * in;
    const auto inp = c.input(n_in), dout = c.input(n_out);
    std::vector<std::vector<float>> weight, dweight;
    std::vector<const Act*> g_weight, weight_ptr;
    std::vector<float*> g_dweight, dweight_ptr;
    for (int g = 0; g < groups; g++) {
      weight.push_back(c.input(n_w, 0.05f));
      dweight.push_back(c.input(n_w));
      g_weight.push_back(c.act(weight.back()));
      g_dweight.push_back(c.f32(dweight.back()));
    }
    for (int g = 0; g < groups; g++) weight_ptr.push_back(as_act(weight[g].data()));
    for (int g = 0; g < groups; g++) dweight_ptr.push_back(dweight[g].data());
    std::string at = " " + std::to_string(groups) + " groups x" + std::to_string(in) + "x" + std::to_string(outc);
    std::vector<float> out(n_out), dinp(n_in);
    Act *g_out = c.act(n_out), *g_inp = c.act(inp), *g_dinp = c.act(n_in);
    gpu.set_grouped_gemm(GroupedGemmSetting::grouped);  // checked whatever this run's choice; each shape anew
    gpu.grouped_matmul_forward(g_out, g_inp, g_weight.data(), rows.data(), groups, in, outc);
    at += gpu.grouped_gemm_on() ? "" : " (ran per expert)";  // cuBLAS refused the shape
    cpu.grouped_matmul_forward(as_act(out.data()), as_act(inp.data()), weight_ptr.data(), rows.data(), groups, in, outc);
    c.compare("grouped_matmul_forward" + at, c.host(g_out, n_out), out);
    gpu.grouped_matmul_backward(g_dinp, g_dweight.data(), c.act(dout), g_inp, g_weight.data(), rows.data(), groups, in,
                                outc);
    cpu.grouped_matmul_backward(as_act(dinp.data()), dweight_ptr.data(), as_act(dout.data()), as_act(inp.data()),
                                weight_ptr.data(), rows.data(), groups, in, outc);
    c.compare("grouped_matmul_backward dinp" + at, c.host(g_dinp, n_in), dinp);
    for (int g = 0; g < groups; g++)
      c.compare("grouped_matmul_backward dweight[" + std::to_string(g) + "] +=" + at, c.host(g_dweight[g], n_w),
                dweight[g]);
  });
  // Head dims 32, 64, 128: each kernel instance; multi-head (NKV = NH) and grouped-query
  // (NKV < NH: groups of 4, and multi-query); in bf16 both the tensor-core and the scalar
  // kernels. Plain causal attention over a sequence's own keys (positions 0..T-1 on the
  // device), then masked cases (below).
  std::vector<const char*> attention_kernels = {"scalar"};
  if (c.bf16()) attention_kernels.insert(attention_kernels.begin(), "tensor_core");
  struct Heads {
    int NH, NKV, HD;
  };
  const std::vector<Heads> attention_heads = {{8, 8, 32}, {4, 4, 64}, {2, 2, 128},   // NKV = NH
                                              {8, 2, 32}, {8, 1, 64}, {8, 2, 128}};  // groups of 4, of 8, of 4
  const std::vector<int32_t> plain_positions = iota_positions(T, 0, 1);
  for (const char* kernel : attention_kernels)
  for (const Heads& heads : attention_heads) c.run("attention", [&] {
    setenv("TRIDENT_CUDA_ATTENTION", kernel, 1);
    const auto [NH, NKV, HD] = heads;
    const size_t n_qkv = static_cast<size_t>(N) * (NH + 2 * NKV) * HD, n_out = static_cast<size_t>(N) * NH * HD;
    const int ld = (NH + 2 * NKV) * HD;
    const auto qkv = c.input(n_qkv), dout = c.input(n_out);
    std::vector<float> out(n_out), lse(cpu.attention_stats_floats(B, T, NH)), dqkv(n_qkv);
    Act *g_out = c.act(n_out), *g_qkv = c.act(qkv), *g_dqkv = c.act(n_qkv);
    float* g_stats = c.f32(gpu.attention_stats_floats(B, T, NH));
    const int32_t* g_pos = c.i32(plain_positions);
    const AttentionMask g_mask{g_pos, g_pos, nullptr}, mask{plain_positions.data(), plain_positions.data(), nullptr};
    const size_t k_col = static_cast<size_t>(NH) * HD;  // the k, v columns: a sequence's own keys
    const DType type = gpu.activation_type();
    std::string at = std::string(" ") + kernel + " hd=" + std::to_string(HD) + " T=" + std::to_string(T);
    if (NKV != NH) at += " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV);
    gpu.attention_forward(g_out, g_stats, g_qkv, offset(g_qkv, k_col, type), ld, g_mask, B, T, T, NH, NKV, HD);
    cpu.attention_forward(as_act(out.data()), lse.data(), as_act(qkv.data()), as_act(qkv.data() + k_col), ld, mask, B,
                          T, T, NH, NKV, HD);
    c.compare("attention_forward" + at, c.host(g_out, n_out), out);
    gpu.attention_backward(g_dqkv, offset(g_dqkv, k_col, type), c.act(dout), g_qkv, offset(g_qkv, k_col, type), ld,
                           g_out, g_stats, g_mask, B, T, T, NH, NKV, HD);
    cpu.attention_backward(as_act(dqkv.data()), as_act(dqkv.data() + k_col), as_act(dout.data()), as_act(qkv.data()),
                           as_act(qkv.data() + k_col), ld, as_act(out.data()), lse.data(), mask, B, T, T, NH, NKV, HD);
    c.compare("attention_backward dqkv" + at, c.host(g_dqkv, n_qkv), dqkv);
  });
  // Masked attention against the CPU backend: documents packed into the sequences
  // (random boundaries: documents of 1..80 tokens, many shorter than a tile), and a
  // block of another rank's keys in a buffer of its own (context parallelism: queries
  // at positions T..2T-1, Tk = 3T/4 keys at positions 0, 3, 6, ..., some in the queries'
  // future; kv_ld = 2 NKV HD), its dK, dV into a buffer of the same layout.
  const std::vector<Heads> masked_heads = {{8, 2, 64}, {4, 4, 128}, {4, 1, 32}};
  for (const char* kernel : attention_kernels)
  for (const Heads& heads : masked_heads)
  for (const bool documents : {true, false}) c.run(documents ? "attention, documents" : "attention, other rank's keys", [&] {
    setenv("TRIDENT_CUDA_ATTENTION", kernel, 1);
    const auto [NH, NKV, HD] = heads;
    const int Tq = T, Tk = documents ? T : 3 * T / 4, ld = (NH + 2 * NKV) * HD;
    const int kv_ld = documents ? ld : 2 * NKV * HD;
    const size_t n_qkv = static_cast<size_t>(B) * Tq * ld, n_out = static_cast<size_t>(B) * Tq * NH * HD;
    const size_t n_kv = static_cast<size_t>(B) * Tk * kv_ld, k_col = static_cast<size_t>(NH) * HD;
    const DType type = gpu.activation_type();
    const std::vector<int32_t> q_pos = documents ? plain_positions : iota_positions(Tq, T, 1);
    const std::vector<int32_t> kv_pos = documents ? plain_positions : iota_positions(Tk, 0, 3);
    std::vector<int32_t> doc_start;
    if (documents) doc_start = random_documents(c.ids(static_cast<size_t>(B) * T, 80), B, T);
    const auto qkv = c.input(n_qkv), dout = c.input(n_out);
    const auto kv_block = documents ? std::vector<float>() : c.input(n_kv);
    std::vector<float> out(n_out), lse(cpu.attention_stats_floats(B, Tq, NH)), dqkv(n_qkv), dkv_block(n_kv);
    Act *g_out = c.act(n_out), *g_qkv = c.act(qkv), *g_dqkv = c.act(n_qkv);
    Act* g_kv = documents ? offset(g_qkv, k_col, type) : c.act(kv_block);
    Act* g_dkv = documents ? offset(g_dqkv, k_col, type) : c.act(n_kv);
    const float* kv = documents ? qkv.data() + k_col : kv_block.data();
    float* dkv = documents ? dqkv.data() + k_col : dkv_block.data();
    float* g_stats = c.f32(gpu.attention_stats_floats(B, Tq, NH));
    const AttentionMask g_mask{c.i32(q_pos), c.i32(kv_pos), documents ? c.i32(doc_start) : nullptr};
    const AttentionMask mask{q_pos.data(), kv_pos.data(), documents ? doc_start.data() : nullptr};
    std::string at = std::string(" ") + kernel + " hd=" + std::to_string(HD) + " NH=" + std::to_string(NH) +
                     " NKV=" + std::to_string(NKV) + (documents ? " docs" : " Tk=" + std::to_string(Tk));
    gpu.attention_forward(g_out, g_stats, g_qkv, g_kv, kv_ld, g_mask, B, Tq, Tk, NH, NKV, HD);
    cpu.attention_forward(as_act(out.data()), lse.data(), as_act(qkv.data()), as_act(kv), kv_ld, mask, B, Tq, Tk, NH,
                          NKV, HD);
    c.compare("attention_forward" + at, c.host(g_out, n_out), out);
    c.compare("attention_forward lse" + at, c.host(g_stats, lse.size()), lse);
    gpu.attention_backward(g_dqkv, g_dkv, c.act(dout), g_qkv, g_kv, kv_ld, g_out, g_stats, g_mask, B, Tq, Tk, NH, NKV,
                           HD);
    cpu.attention_backward(as_act(dqkv.data()), as_act(dkv), as_act(dout.data()), as_act(qkv.data()), as_act(kv),
                           kv_ld, as_act(out.data()), lse.data(), mask, B, Tq, Tk, NH, NKV, HD);
    if (documents) {
      c.compare("attention_backward dqkv" + at, c.host(g_dqkv, n_qkv), dqkv);
    } else {  // dq in the q columns of dqkv (its k, v columns are not the call's), dk and dv in dkv
      c.compare("attention_backward dq" + at, q_columns(c.host(g_dqkv, n_qkv), ld, k_col), q_columns(dqkv, ld, k_col));
      c.compare("attention_backward dkv" + at, c.host(g_dkv, n_kv), dkv_block);
    }
  });
  unsetenv("TRIDENT_CUDA_ATTENTION");
  c.run("gelu, add", [&] {
    const size_t n = static_cast<size_t>(N) * 4 * C;
    const auto inp = c.input(n, 2.0f), dout = c.input(n), other = c.input(n);
    std::vector<float> out(n), dinp(n);
    Act *g_out = c.act(n), *g_inp = c.act(inp);
    gpu.gelu_forward(g_out, g_inp, n);
    cpu.gelu_forward(as_act(out.data()), as_act(inp.data()), n);
    c.compare("gelu_forward", c.host(g_out, n), out);
    Act* g_dinp = c.act(n);
    gpu.gelu_backward(g_dinp, g_inp, c.act(dout), n);
    cpu.gelu_backward(as_act(dinp.data()), as_act(inp.data()), as_act(dout.data()), n);
    c.compare("gelu_backward", c.host(g_dinp, n), dinp);
    gpu.add(g_out, g_inp, c.act(other), n);
    cpu.add(as_act(out.data()), as_act(inp.data()), as_act(other.data()), n);
    c.compare("add", c.host(g_out, n), out);
  });
  c.run("cross-entropy", [&] {  // on the second shard [512, 1024) of a 1000-word vocabulary
    const int Vs = 512, start = 512, valid = 1000 - start;
    const auto logits = c.input(static_cast<size_t>(N) * Vs, 3.0f);
    const auto targets = c.ids(N, 1000);
    std::vector<float> row_max(N), sums(2 * N), losses(N), lse(N), dlogits(logits);
    Act* g_logits = c.act(logits);
    int32_t* g_targets = c.i32(targets);
    float *g_max = c.f32(N), *g_sums = c.f32(2 * N), *g_losses = c.f32(N), *g_lse = c.f32(N);
    gpu.logits_row_max(g_max, g_logits, N, valid, Vs);
    cpu.logits_row_max(row_max.data(), as_act(logits.data()), N, valid, Vs);
    c.compare("logits_row_max", c.host(g_max, N), row_max, 1e-6);
    gpu.logits_sum_exp_and_target(g_sums, g_logits, g_max, g_targets, start, N, valid, Vs);
    cpu.logits_sum_exp_and_target(sums.data(), as_act(logits.data()), row_max.data(), targets.data(), start, N, valid,
                                  Vs);
    c.compare("logits_sum_exp_and_target", c.host(g_sums, 2 * N), sums, 1e-5);
    gpu.cross_entropy_loss(g_losses, g_lse, g_max, g_sums, N);
    cpu.cross_entropy_loss(losses.data(), lse.data(), row_max.data(), sums.data(), N);
    c.compare("cross_entropy_loss", c.host(g_losses, N), losses, 1e-5);
    gpu.cross_entropy_backward(g_logits, g_lse, g_targets, start, N, valid, Vs, 0.01f);
    cpu.cross_entropy_backward(as_act(dlogits.data()), lse.data(), targets.data(), start, N, valid, Vs, 0.01f);
    c.compare("cross_entropy_backward", c.host(g_logits, dlogits.size()), dlogits);
  });
  c.run("optimizer", [&] {  // fp32 everywhere
    const size_t n = 1 << 20;
    std::vector<float> param(n), grad(n), m(n), v(n);
    std::mt19937_64 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < n; i++) {
      param[i] = normal(rng);
      grad[i] = normal(rng);
      m[i] = 0.1f * normal(rng);
      v[i] = 0.01f * std::abs(normal(rng));
    }
    float *g_param = c.f32(param), *g_grad = c.f32(grad), *g_m = c.f32(m), *g_v = c.f32(v);
    gpu.adamw_update(g_param, g_grad, g_m, g_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f);
    cpu.adamw_update(param.data(), grad.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f);
    c.compare("adamw_update params", c.host(g_param, n), param, 1e-6);
    c.compare("adamw_update exp_avg_sq", c.host(g_v, n), v, 1e-6);
    // Lion on the updated values: its momentum in m, the sign of the interpolation.
    gpu.lion_update(g_param, g_grad, g_m, n, 3e-4f, 0.9f, 0.99f, 0.5f, 0.5f);
    cpu.lion_update(param.data(), grad.data(), m.data(), n, 3e-4f, 0.9f, 0.99f, 0.5f, 0.5f);
    c.compare("lion_update params", c.host(g_param, n), param, 1e-6);
    c.compare("lion_update exp_avg", c.host(g_m, n), m, 1e-6);
    const double want = cpu.sum_squares(grad.data(), n), got = gpu.sum_squares(g_grad, n);
    c.compare("sum_squares", {static_cast<float>(got)}, {static_cast<float>(want)}, 1e-6);
    // A step's sums on the device: two ranges into one total, read once.
    double want_total = 0;
    cpu.accumulate_sum_squares(&want_total, grad.data(), n / 2);
    cpu.accumulate_sum(&want_total, grad.data() + n / 2, n / 2);
    auto* g_total = reinterpret_cast<double*>(c.f32(2));
    gpu.accumulate_sum_squares(g_total, g_grad, n / 2);
    gpu.accumulate_sum(g_total, g_grad + n / 2, n / 2);
    double got_total = 0;
    gpu.copy_to_host(&got_total, g_total, sizeof got_total);
    c.compare("accumulate_sum_squares + accumulate_sum", {static_cast<float>(got_total)},
              {static_cast<float>(want_total)}, 1e-6);
  });
}

// Mean seconds of `run` on the GPU over enough repetitions to fill ~0.2 s.
double time_gpu(Kernels& gpu, const std::function<void()>& run) {
  run();
  gpu.synchronize();
  using clock = std::chrono::steady_clock;
  int reps = 0;
  const auto start = clock::now();
  double elapsed = 0;
  do {
    run();
    reps++;
    gpu.synchronize();
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed < 0.2 || reps < 3);
  return elapsed / reps;
}

// The timing table's rows, each on its own: an exception (a CUDA error, out of memory)
// prints that row as failed, with the message, counts it, and the next row still runs.
class TimingRows {
 public:
  explicit TimingRows(Kernels& gpu) : gpu_(gpu) {}

  // Runs `step` (an allocation, say); false after printing it failed.
  bool attempt(const std::string& what, const std::function<void()>& step) {
    try {
      step();
      return true;
    } catch (const std::exception& e) {
      failures_++;
      std::printf("| %-44s | %8s | FAIL: %s |\n", what.c_str(), "error", e.what());
      return false;
    }
  }
  // Seconds per run, or NaN after printing the row failed.
  double time(const std::string& what, const std::function<void()>& run) {
    double seconds = NAN;
    attempt(what, [&] { seconds = time_gpu(gpu_, run); });
    return seconds;
  }
  // A row timed earlier by time(); nothing for a failed one (already printed).
  void print(const std::string& what, double seconds, double amount, const char* unit) {
    if (!std::isnan(seconds))
      std::printf("| %-44s | %8.3f | %8.1f %s |\n", what.c_str(), seconds * 1e3, amount / seconds / 1e12, unit);
  }
  void row(const std::string& what, const std::function<void()>& run, double amount, const char* unit) {
    print(what, time(what, run), amount, unit);
  }
  int failures() const { return failures_; }

 private:
  Kernels& gpu_;
  int failures_ = 0;
};

// Device buffers freed when the table ends, however it ends.
class Buffers {
 public:
  explicit Buffers(Kernels& gpu) : gpu_(gpu) {}
  Buffers(const Buffers&) = delete;
  ~Buffers() {
    for (void* p : keep_) try {
        gpu_.free(p);
      } catch (const std::exception&) {  // a broken context: the process ends anyway
      }
  }
  Act* act(size_t n) { return static_cast<Act*>(keep_.emplace_back(gpu_.alloc(gpu_.activation_bytes(n)))); }
  float* f32(size_t n) { return static_cast<float*>(keep_.emplace_back(gpu_.alloc(n * sizeof(float)))); }
  int32_t* i32(const std::vector<int32_t>& host) {
    auto* p = static_cast<int32_t*>(keep_.emplace_back(gpu_.alloc(host.size() * sizeof(int32_t))));
    gpu_.copy_to_device(p, host.data(), host.size() * sizeof(int32_t));
    return p;
  }

 private:
  Kernels& gpu_;
  std::vector<void*> keep_;
};

// The attention rows of a timing table (`prefix`: "" or "GQA "): the flash kernels the
// training path takes (tensor cores in bf16), the scalar flash kernels beside them, the
// naive three-kernel version, and how much faster flash is than naive; then the flash
// kernels with the sequences packed with documents of 256 tokens (document mask: the
// tiles of other documents skipped, so far less than causal attention's time).
struct AttentionOperands {
  Act *out, *qkv, *dqkv, *dout;
  float* stats;
};
void attention_rows(TimingRows& rows, Kernels& gpu, Buffers& buffers, const std::string& prefix,
                    const AttentionOperands& a, int B, int T, int NH, int NKV, int HD, const char* target) {
  const DType type = gpu.activation_type();
  // Causal: half of the 4*B*NH*T^2*HD multiply-adds of the two products.
  const double flops = 2.0 * B * NH * static_cast<double>(T) * T * HD;
  const bool tensor_cores = gpu.precision() == Precision::bf16;
  const std::string fwd_row = prefix + "attention_forward, flash" + (tensor_cores ? " (tensor cores)" : "");
  const std::string bwd_row = prefix + "attention_backward, flash" + (tensor_cores ? " (tensor cores)" : "");
  const int ld = (NH + 2 * NKV) * HD, doc = 256;
  const size_t k_col = static_cast<size_t>(NH) * HD;
  AttentionMask mask, docs;
  if (!rows.attempt(prefix + "attention positions", [&] {
        std::vector<int32_t> pos(T), starts(static_cast<size_t>(B) * T);
        for (int i = 0; i < T; i++) pos[i] = i;
        for (size_t i = 0; i < starts.size(); i++) starts[i] = static_cast<int32_t>(i % T) / doc * doc;
        const int32_t* g_pos = buffers.i32(pos);
        mask = {g_pos, g_pos, nullptr};
        docs = {g_pos, g_pos, buffers.i32(starts)};
      }))
    return;
  const auto forward_with = [&](const AttentionMask& m) {
    gpu.attention_forward(a.out, a.stats, a.qkv, offset(a.qkv, k_col, type), ld, m, B, T, T, NH, NKV, HD);
  };
  const auto backward_with = [&](const AttentionMask& m) {
    gpu.attention_backward(a.dqkv, offset(a.dqkv, k_col, type), a.dout, a.qkv, offset(a.qkv, k_col, type), ld, a.out,
                           a.stats, m, B, T, T, NH, NKV, HD);
  };
  const auto forward = [&] { forward_with(mask); };
  const auto backward = [&] { backward_with(mask); };
  const double flash_fwd = rows.time(fwd_row, forward), flash_bwd = rows.time(bwd_row, backward);
  const std::string docs_row = ", flash, documents of " + std::to_string(doc);
  const double docs_fwd = rows.time(prefix + "attention_forward" + docs_row, [&] { forward_with(docs); });
  const double docs_bwd = rows.time(prefix + "attention_backward" + docs_row, [&] { backward_with(docs); });
  // Documents of `doc` tokens: each row sees about doc / 2 keys, not T / 2.
  const double docs_flops = 2.0 * B * NH * static_cast<double>(T) * doc * HD;
  double scalar_fwd = NAN, scalar_bwd = NAN;
  if (tensor_cores) {
    setenv("TRIDENT_CUDA_ATTENTION", "scalar", 1);
    scalar_fwd = rows.time(prefix + "attention_forward, flash (scalar)", forward);
    scalar_bwd = rows.time(prefix + "attention_backward, flash (scalar)", backward);
    unsetenv("TRIDENT_CUDA_ATTENTION");
  }
  float *probs = nullptr, *dprobs = nullptr;
  double naive_fwd = NAN, naive_bwd = NAN;
  if (rows.attempt("naive attention buffers (2 x B*NH*T*T floats)", [&] {
        probs = buffers.f32(static_cast<size_t>(B) * NH * T * T);
        dprobs = buffers.f32(static_cast<size_t>(B) * NH * T * T);
      })) {
    naive_fwd = rows.time(prefix + "attention_forward, naive three kernels",
                          [&] { cuda::naive_attention_forward(type, a.out, probs, a.qkv, B, T, NH, NKV, HD); });
    naive_bwd = rows.time(prefix + "attention_backward, naive three kernels", [&] {
      cuda::naive_attention_backward(type, a.dqkv, dprobs, a.dout, a.qkv, probs, B, T, NH, NKV, HD);
    });
  }
  rows.print(fwd_row, flash_fwd, flops, "TFLOP/s");
  rows.print(prefix + "attention_forward, flash (scalar)", scalar_fwd, flops, "TFLOP/s");
  rows.print(prefix + "attention_forward, naive three kernels", naive_fwd, flops, "TFLOP/s");
  rows.print(bwd_row, flash_bwd, 2.5 * flops, "TFLOP/s");
  rows.print(prefix + "attention_backward, flash (scalar)", scalar_bwd, 2.5 * flops, "TFLOP/s");
  rows.print(prefix + "attention_backward, naive three kernels", naive_bwd, 2.5 * flops, "TFLOP/s");
  rows.print(prefix + "attention_forward" + docs_row, docs_fwd, docs_flops, "TFLOP/s");
  rows.print(prefix + "attention_backward" + docs_row, docs_bwd, 2.5 * docs_flops, "TFLOP/s");
  if (!std::isnan(flash_fwd + flash_bwd + docs_fwd + docs_bwd))
    std::printf("| %sdocuments of %d vs causal: forward %.1fx, backward %.1fx faster | | |\n", prefix.c_str(), doc,
                flash_fwd / docs_fwd, flash_bwd / docs_bwd);
  if (!std::isnan(flash_fwd + flash_bwd + naive_fwd + naive_bwd))
    std::printf("| %sflash vs naive: forward %.1fx, backward %.1fx faster%s | | |\n", prefix.c_str(),
                naive_fwd / flash_fwd, naive_bwd / flash_bwd, target);
}

// The GEMM peak and the timing table at GPT-2 124M's shapes; returns the failed rows.
int timing_table(Kernels& gpu) {
  TimingRows rows(gpu);
  rows.attempt(std::string("GEMM peak (8192^3, ") + precision_name(gpu.precision()) + ")", [&] {
    const double gflops = gpu.measure_gemm_gflops(8192, 1.0);
    std::printf("GEMM peak (8192^3, %s): %.1f TFLOP/s\n", precision_name(gpu.precision()), gflops / 1e3);
  });
  const int B = 16, T = 1024, C = 768, NH = 12, Vp = 50304, N = B * T;
  Buffers buffers(gpu);
  const auto A = [&](size_t n) { return buffers.act(n); };
  const auto F = [&](size_t n) { return buffers.f32(n); };
  Act *x = nullptr, *qkv = nullptr, *fc = nullptr, *fc2 = nullptr, *w = nullptr, *bias = nullptr, *out = nullptr,
      *dout = nullptr, *dqkv = nullptr, *logits = nullptr;
  float *stats = nullptr, *mean = nullptr, *rstd = nullptr, *dw = nullptr, *db = nullptr, *row_max = nullptr,
        *sums = nullptr, *losses = nullptr, *lse = nullptr;
  int32_t* targets = nullptr;
  const bool ready = rows.attempt("timing buffers", [&] {
    x = A(static_cast<size_t>(N) * C), qkv = A(static_cast<size_t>(N) * 3 * C), fc = A(static_cast<size_t>(N) * 4 * C);
    fc2 = A(static_cast<size_t>(N) * 4 * C), w = A(static_cast<size_t>(Vp) * C), bias = A(4 * C);
    out = A(static_cast<size_t>(N) * C), dout = A(static_cast<size_t>(N) * C), dqkv = A(static_cast<size_t>(N) * 3 * C);
    logits = A(static_cast<size_t>(N) * Vp);
    stats = F(static_cast<size_t>(B) * NH * T), mean = F(N), rstd = F(N), dw = F(static_cast<size_t>(Vp) * C);
    db = F(Vp), row_max = F(N), sums = F(2 * N), losses = F(N), lse = F(N);
    targets = reinterpret_cast<int32_t*>(F(N));
    // small values, not zeros: realistic power draw and softmax
    std::vector<float> values(static_cast<size_t>(N) * 4 * C);
    for (size_t i = 0; i < values.size(); i++) values[i] = 0.02f * static_cast<float>(static_cast<int>((i * 7919) % 101) - 50) / 50.0f;
    for (Act* p : {x, out, dout}) gpu.activations_from_host(p, values.data(), static_cast<size_t>(N) * C);
    gpu.activations_from_host(qkv, values.data(), static_cast<size_t>(N) * 3 * C);
    gpu.activations_from_host(fc, values.data(), static_cast<size_t>(N) * 4 * C);
    gpu.activations_from_host(w, values.data(), static_cast<size_t>(Vp) * C > values.size() ? values.size() : static_cast<size_t>(Vp) * C);
    std::vector<int32_t> t(N);
    for (int i = 0; i < N; i++) t[i] = (i * 31) % 50257;
    gpu.copy_to_device(targets, t.data(), t.size() * sizeof(int32_t));
  });
  if (!ready) return rows.failures();
  std::printf("\n| kernel at B=16 T=1024 C=768 NH=12 (%s) | ms | rate |\n|---|---:|---:|\n", precision_name(gpu.precision()));
  const auto gemm_flops = [](double m, double k, double n) { return 2.0 * m * k * n; };
  rows.row("matmul_forward qkv (16384x768x2304)", [&] { gpu.matmul_forward(qkv, x, w, bias, N, C, 3 * C); },
           gemm_flops(N, C, 3 * C), "TFLOP/s");
  rows.row("matmul_forward fc (16384x768x3072)", [&] { gpu.matmul_forward(fc, x, w, bias, N, C, 4 * C); },
           gemm_flops(N, C, 4 * C), "TFLOP/s");
  rows.row("matmul_backward fc (dinp + dweight + dbias)", [&] { gpu.matmul_backward(x, dw, db, fc, x, w, N, C, 4 * C); },
           2 * gemm_flops(N, C, 4 * C), "TFLOP/s");
  rows.row("matmul_forward lm head (16384x768x50304)", [&] { gpu.matmul_forward(logits, x, w, nullptr, N, C, Vp); },
           gemm_flops(N, C, Vp), "TFLOP/s");
  const double act_bytes = static_cast<double>(gpu.activation_bytes(static_cast<size_t>(N) * C));
  rows.row("layernorm_forward", [&] { gpu.layernorm_forward(out, mean, rstd, x, w, bias, N, C, 1e-5f); },
           2 * act_bytes * 1e3, "GB/s");
  rows.row("layernorm_backward", [&] { gpu.layernorm_backward(x, dw, db, dout, out, w, mean, rstd, N, C); },
           4 * act_bytes * 1e3, "GB/s");
  const double fc_bytes = 4 * act_bytes;
  rows.row("gelu_forward", [&] { gpu.gelu_forward(fc2, fc, static_cast<size_t>(N) * 4 * C); }, 2 * fc_bytes * 1e3,
           "GB/s");
  rows.row("gelu_backward", [&] { gpu.gelu_backward(fc2, fc, fc2, static_cast<size_t>(N) * 4 * C); },
           3 * fc_bytes * 1e3, "GB/s");
  attention_rows(rows, gpu, buffers, "", {out, qkv, dqkv, dout, stats}, B, T, NH, NH, C / NH, " (target >= 3x)");
  const double logits_bytes = static_cast<double>(gpu.activation_bytes(static_cast<size_t>(N) * Vp));
  rows.row("cross-entropy (max, sum, loss, backward)", [&] {
        gpu.logits_row_max(row_max, logits, N, 50257, Vp);
        gpu.logits_sum_exp_and_target(sums, logits, row_max, targets, 0, N, 50257, Vp);
        gpu.cross_entropy_loss(losses, lse, row_max, sums, N);
        gpu.cross_entropy_backward(logits, lse, targets, 0, N, 50257, Vp, 1e-5f);
      },
      4 * logits_bytes * 1e3, "GB/s");
  const size_t params = 124'475'904;
  float *p = nullptr, *g = nullptr, *m = nullptr, *v = nullptr;
  if (rows.attempt("optimizer buffers (4 x 124M fp32)", [&] { p = F(params), g = F(params), m = F(params), v = F(params); })) {
    rows.row("adamw_update (124M fp32)", [&] { gpu.adamw_update(p, g, m, v, params, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f); },
             7.0 * 4 * params * 1e3, "GB/s");
    rows.row("sum_squares (124M fp32)", [&] { gpu.sum_squares(g, params); }, 4.0 * params * 1e3, "GB/s");
  }
  return rows.failures();
}

// Fills n activations with small values (not zeros: realistic power draw and softmax),
// uploading one pattern chunk after another.
void fill_pattern(Kernels& gpu, Act* p, size_t n) {
  static const std::vector<float> pattern = [] {
    std::vector<float> v(1 << 20);
    for (size_t i = 0; i < v.size(); i++) v[i] = 0.02f * static_cast<float>(static_cast<int>((i * 7919) % 101) - 50) / 50.0f;
    return v;
  }();
  for (size_t at = 0; at < n; at += pattern.size())
    gpu.activations_from_host(offset(p, at, gpu.activation_type()), pattern.data(), std::min(pattern.size(), n - at));
}

// A mixture's experts at Qwen3-30B-A3B's shapes (128 experts of width 768 over d 2048, top
// 8 of 8192 tokens: 512 rows each): the gate | up GEMMs of every expert as one grouped
// GEMM against one GEMM per expert (the base class's loop), forward and backward.
// The grouped rows time the grouped GEMM whatever this process's choice (TRIDENT_GROUPED_GEMM,
// a record, or the odd-shape check above turning it off for "not supported"), and say so
// where cuBLAS still refused it and the row ran per expert. `measured`: both ways' times.
void experts_rows(TimingRows& rows, Kernels& gpu, Buffers& buffers, std::optional<GroupedGemmMeasurement>& measured) {
  const int E = 128, C = 2048, F2 = 2 * 768, per = 512, R = E * per;
  std::vector<int> counts(E, per);
  std::vector<const Act*> weights;
  std::vector<float*> grads;
  Act *x = nullptr, *y = nullptr, *dx = nullptr;
  if (!rows.attempt("experts' buffers", [&] {
        x = buffers.act(static_cast<size_t>(R) * C), y = buffers.act(static_cast<size_t>(R) * F2);
        dx = buffers.act(static_cast<size_t>(R) * C);
        fill_pattern(gpu, x, static_cast<size_t>(R) * C);
        fill_pattern(gpu, y, static_cast<size_t>(R) * F2);
        Act* w = buffers.act(static_cast<size_t>(E) * F2 * C);
        fill_pattern(gpu, w, static_cast<size_t>(E) * F2 * C);
        float* g = buffers.f32(static_cast<size_t>(E) * F2 * C);
        for (int e = 0; e < E; e++) {
          weights.push_back(offset(w, static_cast<size_t>(e) * F2 * C, gpu.activation_type()));
          grads.push_back(g + static_cast<size_t>(e) * F2 * C);
        }
      }))
    return;
  const double flops = 2.0 * R * C * F2;
  gpu.set_grouped_gemm(GroupedGemmSetting::grouped);
  // A grouped row that cuBLAS turned down ran per expert: its label says so.
  const auto grouped_label = [&](std::string label) {
    return gpu.grouped_gemm_on() ? label : label + " [RAN PER EXPERT: grouped not supported]";
  };
  const double fwd_grouped = rows.time("experts gate|up fwd, grouped", [&] {
    gpu.grouped_matmul_forward(y, x, weights.data(), counts.data(), E, C, F2);
  });
  rows.print(grouped_label("experts gate|up fwd, grouped (128 x 512x2048x1536)"), fwd_grouped, flops, "TFLOP/s");
  const double fwd_each = rows.time("experts gate|up fwd, a GEMM per expert", [&] {
    gpu.Kernels::grouped_matmul_forward(y, x, weights.data(), counts.data(), E, C, F2);
  });
  rows.print("experts gate|up fwd, a GEMM per expert", fwd_each, flops, "TFLOP/s");
  const double bwd_grouped = rows.time("experts gate|up bwd, grouped", [&] {
    gpu.grouped_matmul_backward(dx, grads.data(), y, x, weights.data(), counts.data(), E, C, F2);
  });
  rows.print(grouped_label(gpu.precision() == Precision::bf16 ? "experts gate|up bwd, grouped dinp + dweight per expert"
                                                              : "experts gate|up bwd, grouped (dinp + dweight)"),
             bwd_grouped, 2 * flops, "TFLOP/s");
  const double bwd_each = rows.time("experts gate|up bwd, a GEMM per expert", [&] {
    gpu.Kernels::grouped_matmul_backward(dx, grads.data(), y, x, weights.data(), counts.data(), E, C, F2);
  });
  rows.print("experts gate|up bwd, a GEMM per expert", bwd_each, 2 * flops, "TFLOP/s");
  if (std::isnan(fwd_grouped + fwd_each + bwd_grouped + bwd_each)) return;  // a failed row: nothing to record
  measured = GroupedGemmMeasurement{device_model(), (fwd_grouped + bwd_grouped) * 1e3, (fwd_each + bwd_each) * 1e3,
                                    gpu.grouped_gemm_on()};
  std::printf("| %-44s | %8s | %-17s |\n", "experts fwd + bwd: the faster", "",
              measured->grouped_wins() ? "grouped" : "a GEMM per expert");
}

// The Llama kernels timed at Llama-2-7B / Llama-3-8B shapes (d 4096, SwiGLU 11008, 32
// heads of 128 over 8 key/value heads), 8192 tokens: RMSNorm, SwiGLU, rotary embeddings,
// and grouped-query flash attention against the naive three kernels. Returns the failed rows.
int llama_timing_table(Kernels& gpu, std::optional<GroupedGemmMeasurement>& experts_measured) {
  TimingRows rows(gpu);
  const int C = 4096, F = 11008, NH = 32, NKV = 8, HD = 128, N = 8192;
  const int rope_B = 2, rope_T = 4096;    // rotary embeddings over 4096 positions
  const int att_B = 4, att_T = 2048;      // attention: 4 sequences of 2048, then 2 of 4096
  const size_t W = static_cast<size_t>(NH + 2 * NKV) * HD;  // one qkv row
  Buffers buffers(gpu);
  Act *x = nullptr, *y = nullptr, *dy = nullptr, *dx = nullptr, *gate_up = nullptr, *h = nullptr, *dh = nullptr,
      *dgate_up = nullptr, *qkv = nullptr, *dqkv = nullptr, *out = nullptr, *dout = nullptr, *w = nullptr;
  float *rstd = nullptr, *dw = nullptr, *table = nullptr, *stats = nullptr;
  const bool ready = rows.attempt("Llama timing buffers", [&] {
    const size_t NC = static_cast<size_t>(N) * C, NF = static_cast<size_t>(N) * F;
    x = buffers.act(NC), y = buffers.act(NC), dy = buffers.act(NC), dx = buffers.act(NC), w = buffers.act(C);
    gate_up = buffers.act(2 * NF), h = buffers.act(NF), dh = buffers.act(NF), dgate_up = buffers.act(2 * NF);
    qkv = buffers.act(N * W), dqkv = buffers.act(N * W), out = buffers.act(static_cast<size_t>(N) * NH * HD);
    dout = buffers.act(static_cast<size_t>(N) * NH * HD);
    rstd = buffers.f32(N), dw = buffers.f32(C), stats = buffers.f32(static_cast<size_t>(att_B) * NH * att_T);
    for (Act* p : {x, dy, dx}) fill_pattern(gpu, p, NC);
    fill_pattern(gpu, w, C);
    fill_pattern(gpu, gate_up, 2 * NF);
    fill_pattern(gpu, dh, NF);
    fill_pattern(gpu, qkv, N * W);
    fill_pattern(gpu, dout, static_cast<size_t>(N) * NH * HD);
    std::vector<float> t(static_cast<size_t>(rope_T) * HD);  // [T][HD/2][cos, sin], theta 500000
    for (int p = 0; p < rope_T; p++)
      for (int i = 0; i < HD / 2; i++) {
        const double angle = p * std::pow(500000.0, -2.0 * i / HD);
        t[(static_cast<size_t>(p) * HD / 2 + i) * 2] = static_cast<float>(std::cos(angle));
        t[(static_cast<size_t>(p) * HD / 2 + i) * 2 + 1] = static_cast<float>(std::sin(angle));
      }
    table = buffers.f32(t.size());
    gpu.copy_to_device(table, t.data(), t.size() * sizeof(float));
  });
  if (!ready) return rows.failures();
  std::printf("\n| Llama kernel, N=%d C=%d F=%d NH=%d NKV=%d HD=%d, attention B=%d T=%d and B=%d T=%d (%s) | ms | rate |\n"
              "|---|---:|---:|\n",
              N, C, F, NH, NKV, HD, att_B, att_T, att_B / 2, 2 * att_T, precision_name(gpu.precision()));
  const double bytes = static_cast<double>(gpu.activation_bytes(1));
  const double nc = static_cast<double>(N) * C, nf = static_cast<double>(N) * F;
  rows.row("rmsnorm_forward (8192x4096)", [&] { gpu.rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f); },
           2 * nc * bytes * 1e3, "GB/s");
  rows.row("rmsnorm_backward (8192x4096)", [&] { gpu.rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C); },
           4 * nc * bytes * 1e3, "GB/s");
  rows.row("swiglu_forward (8192x11008)", [&] { gpu.swiglu_forward(h, gate_up, N, F); }, 3 * nf * bytes * 1e3,
           "GB/s");
  rows.row("swiglu_backward (8192x11008)", [&] { gpu.swiglu_backward(dgate_up, gate_up, dh, N, F); },
           5 * nf * bytes * 1e3, "GB/s");
  const double rope_bytes = 2.0 * rope_B * rope_T * (NH + NKV) * HD * bytes;  // q and k, read and written
  rows.row("rope_forward (B=2 T=4096)", [&] { gpu.rope_forward(qkv, table, rope_B, rope_T, NH, NKV, HD); },
           rope_bytes * 1e3, "GB/s");
  rows.row("rope_backward (B=2 T=4096)", [&] { gpu.rope_backward(dqkv, table, rope_B, rope_T, NH, NKV, HD); },
           rope_bytes * 1e3, "GB/s");
  experts_rows(rows, gpu, buffers, experts_measured);
  attention_rows(rows, gpu, buffers, "GQA T=2048 ", {out, qkv, dqkv, dout, stats}, att_B, att_T, NH, NKV, HD, "");
  attention_rows(rows, gpu, buffers, "GQA T=4096 ", {out, qkv, dqkv, dout, stats}, att_B / 2, 2 * att_T, NH, NKV, HD,
                 " (target >= 3x)");
  return rows.failures();
}

// --moe-router-memory: the router and dispatch kernels of a mixture at Qwen3-30B-A3B's
// router shapes (N tokens, E experts, top K, width C): first checked against the CPU on
// fewer tokens, then each run once between two readings of free device memory (after a
// synchronization) and timed. A kernel's first run that takes more than `limit` bytes
// fails: the router kernels' per-thread arrays once spilled to 4 KiB of stack per thread,
// which the driver reserves for every resident thread (~1 GiB) at the first launch. Every
// kernel is held to it, not only the router backward: a reservation stays, so an earlier
// kernel that made it would hide a later one's. `free_bytes`: device_free_bytes() on a GPU.
struct MoeShape {
  int N, T, E, K, C;
};
int moe_router_memory(Kernels& cpu, Kernels& gpu, uint64_t seed, const MoeShape& m,
                      const std::function<size_t()>& free_bytes, size_t limit) {
  std::printf("\n| %-38s | prec | rel. error | toler. | |\n|---|---|---:|---:|---|\n", "MoE router kernels, output");
  int failures = 0;
  {
    Comparison c(gpu, seed);
    for (int mode = 0; mode < 4; mode++)
      c.run("moe router", [&] { check_moe(cpu, gpu, c, 2, 128, m.E, m.K, 256, mode); });
    failures += c.failures();
    if (c.broken()) return failures;
  }
  TimingRows rows(gpu);
  Buffers buffers(gpu);
  const size_t NE = static_cast<size_t>(m.N) * m.E, NK = static_cast<size_t>(m.N) * m.K;
  const size_t NC = static_cast<size_t>(m.N) * m.C, routed = NK * m.C;
  float* logits = nullptr;
  Act *dlogits = nullptr, *x = nullptr, *dx = nullptr, *out = nullptr, *dout = nullptr,
      *expert_rows = nullptr, *dexpert_rows = nullptr;
  float *probs = nullptr, *lse = nullptr, *weights = nullptr, *dweights = nullptr, *balance = nullptr;
  int32_t *experts = nullptr, *order = nullptr;
  if (!rows.attempt("MoE router buffers", [&] {
        logits = buffers.f32(NE), dlogits = buffers.act(NE), x = buffers.act(NC), dx = buffers.act(NC);
        out = buffers.act(NC), dout = buffers.act(NC), expert_rows = buffers.act(routed);
        dexpert_rows = buffers.act(routed);
        probs = buffers.f32(NE), lse = buffers.f32(m.N), weights = buffers.f32(NK), dweights = buffers.f32(NK);
        balance = buffers.f32(static_cast<size_t>(m.N / m.T) * m.E);
        fill_pattern(gpu, dlogits, NE);  // the logits: its values in fp32
        std::vector<float> values(NE);
        gpu.activations_to_host(values.data(), dlogits, NE);
        gpu.copy_to_device(logits, values.data(), NE * sizeof(float));
        for (Act* p : {x, dout}) fill_pattern(gpu, p, NC);
        fill_pattern(gpu, expert_rows, routed);
        std::vector<int32_t> chosen(NK), permutation(NK);
        for (size_t i = 0; i < NK; i++) chosen[i] = static_cast<int32_t>(i % m.E);
        for (size_t i = 0; i < NK; i++) permutation[i] = static_cast<int32_t>(i);
        std::shuffle(permutation.begin(), permutation.end(), std::mt19937(5));
        experts = buffers.i32(chosen), order = buffers.i32(permutation);
        const std::vector<float> small(std::max(NK, static_cast<size_t>(m.N / m.T) * m.E), 0.01f);
        gpu.copy_to_device(dweights, small.data(), NK * sizeof(float));
        gpu.copy_to_device(balance, small.data(), static_cast<size_t>(m.N / m.T) * m.E * sizeof(float));
      }))
    return failures + rows.failures();
  std::printf("\n| MoE kernel, N=%d E=%d K=%d C=%d (%s) | ms | device memory its first run took | |\n"
              "|---|---:|---:|---|\n",
              m.N, m.E, m.K, m.C, precision_name(gpu.precision()));
  const auto kernel = [&](const char* name, const std::function<void()>& run) {
    double taken = NAN;
    const bool ran = rows.attempt(name, [&] {
      const size_t before = free_bytes();
      run();
      taken = static_cast<double>(before) - static_cast<double>(free_bytes());  // < 0: some came back
    });
    if (!ran) return;
    const double seconds = rows.time(name, run);
    if (std::isnan(seconds)) return;
    const bool ok = taken <= static_cast<double>(limit);
    failures += ok ? 0 : 1;
    std::printf("| %-38s | %8.3f | %+9.1f MiB | %s |\n", name, seconds * 1e3, taken / (1 << 20),
                ok ? "ok" : ("FAIL: over " + std::to_string(limit >> 20) + " MiB").c_str());
  };
  kernel("moe_router_forward", [&] {
    gpu.moe_router_forward(probs, lse, experts, weights, logits, nullptr, m.N, m.E, m.K, true, false);
  });
  kernel("moe_dispatch", [&] { gpu.moe_dispatch(expert_rows, x, order, m.N, m.K, m.C); });
  kernel("moe_combine", [&] { gpu.moe_combine(out, expert_rows, weights, order, m.N, m.K, m.C); });
  kernel("moe_combine_backward", [&] {
    gpu.moe_combine_backward(dexpert_rows, dweights, dout, expert_rows, weights, order, m.N, m.K, m.C);
  });
  kernel("moe_dispatch_backward", [&] { gpu.moe_dispatch_backward(dx, dexpert_rows, order, m.N, m.K, m.C); });
  kernel("moe_router_backward", [&] {
    gpu.moe_router_backward(dlogits, probs, lse, experts, weights, dweights, balance, m.T, 0.01f, 0.001f, m.N, m.E,
                            m.K, true, false);
  });
  return failures + rows.failures();
}

// --cpu-self-check of --moe-router-memory on the CPU backend, at fewer tokens: with free
// memory that stays, it passes; with free memory that drops by 1 GiB across every first
// run (as the old router kernels' stacks did), each kernel fails. Returns 0 when so.
int moe_router_memory_self_check(Kernels& cpu, uint64_t seed) {
  std::printf("\n--moe-router-memory on the CPU, then with 1 GiB taken by every first run, on purpose:\n");
  auto kernels = make_cpu_kernels(Precision::bf16);
  const MoeShape small{512, 128, 128, 8, 64};
  const size_t limit = 64u << 20;
  const int steady = moe_router_memory(cpu, *kernels, seed, small, [] { return size_t{8} << 30; }, limit);
  size_t free_now = size_t{64} << 30;
  const int leaking = moe_router_memory(cpu, *kernels, seed, small, [&] { return free_now -= size_t{1} << 30; }, limit);
  const bool ok = steady == 0 && leaking == 6;
  std::printf("moe router memory self-check: %s (%d failed with steady memory, %d of 6 with 1 GiB taken)\n",
              ok ? "ok" : "FAIL", steady, leaking);
  return ok ? 0 : 1;
}

// --cpu-self-check of the timing rows (the table itself needs a GPU): a row that throws
// is printed failed and counted, and the next row still runs. Returns 0 when so.
int timing_rows_self_check(Kernels& kernels) {
  std::printf("\ntiming rows, one failing on purpose:\n");
  TimingRows rows(kernels);
  bool next_ran = false;
  rows.row("a row that throws", [] { throw std::runtime_error("deliberate error"); }, 1.0, "x/s");
  rows.row("the next row", [&] { next_ran = true; }, 1.0, "x/s");
  const bool ok = rows.failures() == 1 && next_ran;
  std::printf("timing rows self-check: %s\n", ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

// --cpu-self-check of a fault: the CPU backend faulting in the first attention forward
// as a GPU does (faulty_kernels.h). That group fails, every later group is skipped, the
// program goes on. Returns 0 when so.
int fault_self_check(Kernels& cpu, uint64_t seed) {
  std::printf("\na simulated fault in attention_forward (bf16), on purpose:\n");
  FaultyKernels faulty(make_cpu_kernels(Precision::bf16), "attention_forward");
  int failures = 0, skipped = 0;
  {
    Comparison comparison(faulty, seed);
    check_all(cpu, faulty, comparison);
    failures = comparison.failures();
    skipped = comparison.skipped();
  }  // released without a throw although every call now throws
  const bool ok = faulty.broken() && failures == 1 && skipped > 0;
  std::printf("fault self-check: %s (%d failed, %d skipped after the fault)\n", ok ? "ok" : "FAIL", failures, skipped);
  return ok ? 0 : 1;
}

// The checks and the timing tables of one precision; returns the failed checks and rows.
// `record`: where to write the experts' grouped / per-expert measurement ("": nowhere).
int check_precision(Kernels& cpu, Precision precision, uint64_t seed, bool timing, bool self_check,
                    const std::string& record) {
  std::unique_ptr<Kernels> gpu;
  try {
    gpu = self_check ? make_cpu_kernels(precision) : make_cuda_kernels(precision);
  } catch (const std::exception& e) {
    std::printf("| %-38s | %-4s | %10s | %7s | FAIL: %s |\n", "backend", precision_name(precision), "error", "",
                e.what());
    return 1;
  }
  Comparison comparison(*gpu, seed);
  check_all(cpu, *gpu, comparison);
  int failures = comparison.failures();
  if (comparison.broken()) {
    std::printf("\n%s: the device faulted; the other precision runs in a process of its own: --precision %s\n",
                precision_name(precision), precision == Precision::bf16 ? "fp32" : "bf16");
    return failures;
  }
  if (timing && !self_check) {
    std::optional<GroupedGemmMeasurement> experts;
    const int rows = timing_table(*gpu) + llama_timing_table(*gpu, experts);
    std::printf("\n%s timing: %d rows failed\n", precision_name(precision), rows);
    failures += rows;
    if (!record.empty() && experts) {
      record_grouped_gemm(record, precision, *experts);
      std::printf("recorded in %s: the experts' GEMMs %s in %s on %s (TRIDENT_GPU_CHOICES=%s uses it)\n",
                  record.c_str(), experts->grouped_wins() ? "grouped" : "per expert", precision_name(precision),
                  experts->device.c_str(), record.c_str());
    } else if (!record.empty()) {
      std::printf("nothing recorded in %s for %s: an experts' timing row failed\n", record.c_str(),
                  precision_name(precision));
    }
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  bool timing = true, self_check = false, moe_memory = false, precision_given = false;
  std::string record;
  std::vector<Precision> precisions = {Precision::bf16, Precision::fp32};
  try {
    for (int i = 1; i < argc; i++) {
      if (std::strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = std::stoull(argv[++i]);
      else if (std::strcmp(argv[i], "--precision") == 0 && i + 1 < argc)
        precisions = {parse_precision(argv[++i])}, precision_given = true;
      else if (std::strcmp(argv[i], "--no-timing") == 0) timing = false;
      else if (std::strcmp(argv[i], "--cpu-self-check") == 0) self_check = true;
      else if (std::strcmp(argv[i], "--moe-router-memory") == 0) moe_memory = true;
      else if (std::strcmp(argv[i], "--record") == 0 && i + 1 < argc && argv[i + 1][0] != '\0') record = argv[++i];
      else throw std::invalid_argument(std::string("unknown argument ") + argv[i] +
                                       " (--precision fp32|bf16, --seed N, --no-timing, --cpu-self-check,"
                                       " --moe-router-memory, --record PATH)");
    }
    if (!self_check) select_cuda_device(0);
    auto cpu = make_cpu_kernels(Precision::fp32);
    std::printf("kernel check, seed %llu: ||gpu - cpu|| / ||cpu|| on the same inputs\n\n",
                static_cast<unsigned long long>(seed));
    int failures = 0;
    if (moe_memory) {  // this mode alone: bf16 (training's) unless --precision says
      for (Precision precision : precision_given ? precisions : std::vector<Precision>{Precision::bf16}) {
        auto kernels = self_check ? make_cpu_kernels(precision) : make_cuda_kernels(precision);
        const MoeShape shape = self_check ? MoeShape{512, 128, 128, 8, 64} : MoeShape{16384, 4096, 128, 8, 2048};
        const std::function<size_t()> free_bytes = self_check ? std::function<size_t()>([] { return size_t{0}; })
                                                              : std::function<size_t()>(device_free_bytes);
        failures += moe_router_memory(*cpu, *kernels, seed, shape, free_bytes, 64u << 20);
      }
      std::printf("\n%s: %d failed\n", failures == 0 ? "PASS" : "FAIL", failures);
      return failures == 0 ? 0 : 1;
    }
    std::printf("| %-38s | prec | rel. error | toler. | |\n|---|---|---:|---:|---|\n", "kernel, output");
    for (Precision precision : precisions)
      failures += check_precision(*cpu, precision, seed, timing, self_check, record);
    if (self_check)
      failures += timing_rows_self_check(*cpu) + fault_self_check(*cpu, seed) + moe_router_memory_self_check(*cpu, seed);
    std::printf("\n%s: %d failed\n", failures == 0 ? "PASS" : "FAIL", failures);
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_check: %s\n", e.what());
    return 2;
  }
}
