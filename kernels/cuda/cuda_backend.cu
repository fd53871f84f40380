// The CUDA implementation of kernels/kernels.h: one class over the activation type
// Element (float, or bf16 for mixed precision), dispatching to the launchers of
// cuda_kernels.cuh on the compute stream. (Not `T`: the ops' parameters name the sequence length T.)
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "../bf16.h"
#include "../grouped_gemm_choice.h"
#include "../kernels.h"
#include "cuda_kernels.cuh"
#include "cuda_sizes.h"

namespace trident::kernels {

namespace {

using cuda::bf16;
using cuda::compute_stream;

// Whether this GPU's runtime offers the stream-ordered allocator (cudaMallocAsync):
// some sandboxed or virtualized GPUs do not. TRIDENT_CUDA_NO_MEMORY_POOLS=1 acts as if
// it did not (the fallback, tried where pools exist).
bool memory_pools_supported() {
  const char* off = std::getenv("TRIDENT_CUDA_NO_MEMORY_POOLS");
  if (off != nullptr && *off != '\0' && std::strcmp(off, "0") != 0) return false;
  int device = 0, supported = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
  return supported != 0;
}

// Device memory that grows on demand (scratch of the backward kernels). With memory
// pools it comes from the stream-ordered allocator on the compute stream: the old block
// is freed after the kernels queued before that still use it, and growing never
// synchronizes (cudaFree would, mid-backward). Without pools it is cudaMalloc'd, and
// reserve() sizes it up front (the setup knows the shapes) so that it need not grow;
// growing anyway drains the stream first, counted by `grew_with_sync`.
class Scratch {
 public:
  Scratch(bool pooled, std::function<void()> grew_with_sync) : pooled_(pooled), grew_with_sync_(std::move(grew_with_sync)) {}
  Scratch(const Scratch&) = delete;
  ~Scratch() {
    if (data_ == nullptr) return;
    if (pooled_) cudaFreeAsync(data_, compute_stream());
    else cudaFree(data_);
  }
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    if (pooled_) {
      if (data_ != nullptr) CUDA_CHECK(cudaFreeAsync(data_, compute_stream()));
      data_ = nullptr;
      bytes_ = 0;
      CUDA_CHECK(cudaMallocAsync(&data_, bytes, compute_stream()));
    } else {
      grew_with_sync_();
      CUDA_CHECK(cudaStreamSynchronize(compute_stream()));  // kernels queued earlier may still read it
      if (data_ != nullptr) CUDA_CHECK(cudaFree(data_));
      data_ = nullptr;
      bytes_ = 0;
      CUDA_CHECK(cudaMalloc(&data_, bytes));
    }
    bytes_ = bytes;
  }
  template <typename E>
  E* get(size_t count) {
    reserve(count * sizeof(E));
    return static_cast<E*>(data_);
  }

 private:
  const bool pooled_;
  std::function<void()> grew_with_sync_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Pinned host memory for upload(): a ring of slots, each reused once the copy that read
// it has run (an event), so that the caller's buffer is free at once and the copy stays
// asynchronous. A step's uploads (tokens, targets, the embedding gradient's index, per
// micro-batch) fit the ring many times over: the wait is for a host far ahead of the GPU.
// Every slot is sized up front (reserve(), from Kernels::reserve_uploads(): the largest
// upload of a step, a mixture's rows included) because
// cudaFreeHost and cudaMallocHost stall the whole device.
class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  ~PinnedStaging() {
    for (Slot& s : slots_) {
      if (s.in_flight) cudaEventSynchronize(s.copied);  // its copy may still read the slot
      if (s.host != nullptr) cudaFreeHost(s.host);
      if (s.copied != nullptr) cudaEventDestroy(s.copied);
    }
  }
  // Every slot at least `bytes` (before the first step); returns whether any grew.
  bool reserve(size_t bytes) {
    reserved_ = std::max(reserved_, bytes);
    return grow_all(bytes);
  }
  // Copies src into the next slot and queues the copy to dst; returns whether it had to
  // wait for the device (a host synchronization: a slot still being read, or one that
  // had to grow).
  bool upload(void* dst, const void* src, size_t bytes) {
    Slot& s = slots_[next_];
    next_ = (next_ + 1) % kSlots;
    bool waited = false;
    if (s.in_flight) {
      const cudaError_t state = cudaEventQuery(s.copied);
      if (state == cudaErrorNotReady) {
        waited = true;
        CUDA_CHECK(cudaEventSynchronize(s.copied));
      } else {
        CUDA_CHECK(state);
      }
    }
    if (bytes > s.bytes) {  // larger than reserved: every slot grows now, one stall rather than one per slot
      if (reserved_ > 0 && !said_) {  // nothing reserved: a benchmark's backend, growing as asked
        std::fprintf(stderr, "trident: an upload of %zu bytes is larger than its pinned staging (%zu bytes, "
                             "reserve_uploads()); the slots grow, stalling the device\n", bytes, reserved_);
        said_ = true;
      }
      waited |= grow_all(bytes);
    }
    std::memcpy(s.host, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, compute_stream()));
    CUDA_CHECK(cudaEventRecord(s.copied, compute_stream()));
    s.in_flight = true;
    return waited;
  }

 private:
  struct Slot;
  bool grow_all(size_t bytes) {
    bool grew = false;
    for (Slot& s : slots_) grew |= grow(s, bytes);
    return grew;
  }
  // A slot of at least `bytes` (not in flight); true if it had to grow.
  static bool grow(Slot& s, size_t bytes) {
    if (s.copied == nullptr) CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    if (bytes <= s.bytes) return false;
    if (s.in_flight) CUDA_CHECK(cudaEventSynchronize(s.copied));
    if (s.host != nullptr) CUDA_CHECK(cudaFreeHost(s.host));
    s.host = nullptr;
    CUDA_CHECK(cudaMallocHost(&s.host, bytes));
    s.bytes = bytes;
    return true;
  }

  static constexpr int kSlots = 64;
  struct Slot {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t copied = nullptr;
    bool in_flight = false;
  };
  std::array<Slot, kSlots> slots_{};
  int next_ = 0;
  size_t reserved_ = 0;  // the most reserve() was asked for
  bool said_ = false;    // an upload beyond it, said once
};

using cuda_sizes::kMaxGroupedProblems;

// The model of the current GPU ("NVIDIA H100 80GB HBM3"): what a recorded measurement is of.
std::string device_model() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

template <typename Element>
class CudaKernels final : public Kernels {
 public:
  CudaKernels()
      : pooled_(memory_pools_supported()),
        grouped_(GroupedGemmChoice::from_environment(
            device_model(), std::is_same_v<Element, float> ? Precision::fp32 : Precision::bf16,
            [](const std::string& line) { std::fprintf(stderr, "trident: %s\n", line.c_str()); })) {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    name_ = std::string("cuda:") + std::to_string(device) + " (" + prop.name + ")";
  }

  std::string name() const override { return name_; }
  std::string details() const override {
    return (pooled_ ? "scratch from the stream-ordered memory pool"
                    : "scratch by cudaMalloc, sized up front (this GPU's runtime has no memory pools)") +
           std::string(", ") + grouped_.description();
  }
  Precision precision() const override { return std::is_same_v<Element, float> ? Precision::fp32 : Precision::bf16; }
  DType activation_type() const override { return std::is_same_v<Element, float> ? DType::f32 : DType::bf16; }

  void reserve_workspace(int N, int C, int max_width, int B, int T_, int NH) override {
    scratch_.reserve(std::max({cuda_sizes::layernorm_backward_scratch_floats(N, C),
                               cuda_sizes::rmsnorm_backward_scratch_floats(N, C),
                               cuda_sizes::column_sums_scratch_floats(max_width),
                               static_cast<size_t>(B) * NH * T_}) *
                     sizeof(float));
    index_scratch_.reserve((3 * static_cast<size_t>(N) + 2) * sizeof(int32_t));
    reserve_uploads(cuda_sizes::own_upload_bytes(N));  // the model adds its own (a mixture's rows)
    norm_scratch_.reserve((cuda::sum_partials() + 1) * sizeof(double));  // + sum_squares()'s total
    pointer_scratch_.reserve(3 * kMaxGroupedProblems * sizeof(void*));    // a grouped GEMM's A, B and C arrays
    cuda::gemm_workspace();  // cuBLASLt's, allocated now rather than in the first GEMM
  }

  void* do_alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes > 0 ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: a later launch check must not report it again
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      throw UsageError("out of GPU memory: " + std::to_string(bytes >> 20) + " MiB requested, " +
                       std::to_string(free_bytes >> 20) + " MiB free of " + std::to_string(total >> 20) +
                       " (a smaller train.micro_batch needs less)");
    }
    CUDA_CHECK(e);
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute_stream()));
    CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
    return p;
  }
  void do_free(void* p) override {
    CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
    CUDA_CHECK(cudaFree(p));
  }
  void do_copy_to_device(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_stream()));
    CUDA_CHECK(cudaStreamSynchronize(compute_stream()));  // the host buffer may go away
  }
  void do_copy_to_host(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, compute_stream()));
    CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
  }
  void do_upload(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0 && staging_.upload(dst, src, bytes)) count_host_sync();
  }
  void do_reserve_uploads(size_t bytes) override { staging_.reserve(bytes); }  // before the first step
  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_stream()));
  }
  void fill_zero(void* p, size_t bytes) override { CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute_stream())); }
  void do_synchronize() override { CUDA_CHECK(cudaStreamSynchronize(compute_stream())); }
  void cast_to_activation(Act* compute, const float* master, size_t n) override {
    if (static_cast<const void*>(compute) == static_cast<const void*>(master)) return;
    cuda::cast(t(compute), master, n);
  }
  void do_activations_to_host(float* host, const Act* x, size_t n) override {
    if constexpr (std::is_same_v<Element, float>) {
      do_copy_to_host(host, x, n * sizeof(float));
    } else {
      std::vector<uint16_t> bits(n);
      do_copy_to_host(bits.data(), x, n * sizeof(uint16_t));
      for (size_t i = 0; i < n; i++) host[i] = bf16_bits_to_float(bits[i]);
    }
  }
  void do_activations_from_host(Act* x, const float* host, size_t n) override {
    if constexpr (std::is_same_v<Element, float>) {
      do_copy_to_device(x, host, n * sizeof(float));
    } else {
      std::vector<uint16_t> bits(n);
      for (size_t i = 0; i < n; i++) bits[i] = float_to_bf16_bits(host[i]);
      do_copy_to_device(x, bits.data(), n * sizeof(uint16_t));
    }
  }

  // Every op: its launcher in cuda_kernels.cuh, on the compute stream. Those that need
  // the backend's scratch memory (WITH_WORKSPACE in ops.def) follow, written out.
#define TRIDENT_KERNEL_OP(name, params, args, output) \
  void name params override { [](auto... arg) { cuda::name(t(arg)...); } args; }
#define TRIDENT_KERNEL_OP_WITH_WORKSPACE(name, params, args, output)
#include "kernels/ops.def"

  void embedding_backward(float* dwte_shard, const Act* dout, const int32_t* /*tokens*/, const int32_t* host_tokens,
                          int vocab_start, int shard_rows, int B, int T_, int C) override {
    // Group the positions by token on the host, from the host's copy of the ids (B*T of
    // them), so that each row's gradient is one block's ordered sum: deterministic, no
    // atomics, and no read back from the device.
    check(host_tokens != nullptr, "CUDA embedding_backward needs the token ids in host memory");
    const size_t BT = static_cast<size_t>(B) * T_;
    std::vector<int32_t>& count = csr_count_;
    count.assign(shard_rows + 1, 0);
    for (size_t p = 0; p < BT; p++) {
      const int32_t token = host_tokens[p];
      if (token >= vocab_start && token < vocab_start + shard_rows) count[token - vocab_start]++;
    }
    std::vector<int32_t>& packed = csr_packed_;  // rows | starts | positions, one upload
    packed.clear();
    std::vector<int32_t>& slot = csr_slot_;
    slot.assign(shard_rows, -1);
    int distinct = 0, total = 0;
    for (int r = 0; r < shard_rows; r++)
      if (count[r] > 0) {
        packed.push_back(r);
        distinct++;
      }
    packed.push_back(0);  // starts[0]
    for (int i = 0; i < distinct; i++) {
      const int r = packed[i];
      slot[r] = total;
      total += count[r];
      packed.push_back(total);
    }
    const size_t positions_at = packed.size();
    packed.resize(positions_at + total);
    for (size_t p = 0; p < BT; p++) {
      const int32_t token = host_tokens[p];
      if (token >= vocab_start && token < vocab_start + shard_rows)
        packed[positions_at + slot[token - vocab_start]++] = static_cast<int32_t>(p);
    }
    int32_t* device = index_scratch_.get<int32_t>(3 * BT + 2);  // the most it can hold: one size every step
    upload(device, packed.data(), packed.size() * sizeof(int32_t));
    cuda::embedding_backward(dwte_shard, t(dout), device, device + distinct, device + 2 * distinct + 1, distinct, C);
  }
  void layernorm_backward(Act* dinp, float* dweight, float* dbias, const Act* dout, const Act* inp, const Act* weight,
                          const float* mean, const float* rstd, int N, int C) override {
    float* scratch = scratch_.get<float>(cuda::layernorm_backward_scratch_floats(N, C));
    cuda::layernorm_backward(t(dinp), dweight, dbias, t(dout), t(inp), t(weight), mean, rstd, N, C, scratch);
  }
  void matmul_backward(Act* dinp, float* dweight, float* dbias, const Act* dout, const Act* inp, const Act* weight,
                       int N, int C, int OC) override {
    if (dinp != nullptr)
      cuda::gemm<Element, Element>(false, false, N, C, OC, t(dout), t(weight), t(dinp), nullptr, false);
    if (dweight != nullptr)
      cuda::gemm<Element, float>(true, false, OC, C, N, t(dout), t(inp), dweight, nullptr, true);  // fp32 gradients
    if (dbias != nullptr)
      cuda::column_sums(dbias, t(dout), N, OC, scratch_.get<float>(cuda::column_sums_scratch_floats(OC)));
  }
  // The experts' GEMMs as one cuBLAS grouped GEMM per pass (kernels.h).
  void grouped_matmul_forward(Act* out, const Act* inp, const Act* const* weights, const int* rows, int groups, int C,
                              int OC) override {
    GroupedProblems g;
    size_t row = 0;
    for (int i = 0; i < groups; i++) {
      if (rows[i] > 0) g.add(rows[i], OC, C, t(inp) + row * C, t(weights[i]), t(out) + row * OC);
      row += static_cast<size_t>(rows[i]);
    }
    run_grouped<Element>(g, false, true, false);
  }
  void grouped_matmul_backward(Act* dinp, float* const* dweights, const Act* dout, const Act* inp,
                               const Act* const* weights, const int* rows, int groups, int C, int OC) override {
    GroupedProblems input, weight;
    size_t row = 0;
    for (int i = 0; i < groups; i++) {
      if (rows[i] > 0 && dinp != nullptr)
        input.add(rows[i], C, OC, t(dout) + row * OC, t(weights[i]), t(dinp) + row * C);
      if (rows[i] > 0 && dweights != nullptr)
        weight.add(OC, C, rows[i], t(dout) + row * OC, t(inp) + row * C, dweights[i]);
      row += static_cast<size_t>(rows[i]);
    }
    run_grouped<Element>(input, false, false, false);
    run_grouped<float>(weight, true, false, true);  // fp32 gradients, added
  }
  bool grouped_gemm_on() const override { return grouped_.on(); }
  void set_grouped_gemm(GroupedGemmSetting setting) override { grouped_.set(setting); }
  void rmsnorm_backward(Act* dinp, float* dweight, const Act* dout, const Act* inp, const Act* weight,
                        const float* rstd, int N, int C) override {
    float* scratch = scratch_.get<float>(cuda::rmsnorm_backward_scratch_floats(N, C));
    cuda::rmsnorm_backward(t(dinp), dweight, t(dout), t(inp), t(weight), rstd, N, C, scratch);
  }
  size_t attention_stats_floats(int B, int T_, int NH) const override {
    return cuda_sizes::attention_stats_floats(B, T_, NH);  // each row's log-sum-exp
  }
  void attention_backward(Act* dqkv, Act* dkv, const Act* dout, const Act* qkv, const Act* kv, int kv_ld,
                          const Act* out, const float* stats, AttentionMask mask, int B, int Tq, int Tk, int NH,
                          int NKV, int HD) override {
    float* delta = scratch_.get<float>(static_cast<size_t>(B) * NH * Tq);
    cuda::attention_backward(t(dqkv), t(dkv), t(dout), t(qkv), t(kv), kv_ld, t(out), stats, mask, B, Tq, Tk, NH, NKV,
                             HD, delta);
  }
  void accumulate_sum(double* total, const float* x, size_t n) override {
    cuda::accumulate_sum(total, norm_scratch_.get<double>(cuda::sum_partials()), x, n, /*squares=*/false);
  }
  void accumulate_sum_squares(double* total, const float* x, size_t n) override {
    cuda::accumulate_sum(total, norm_scratch_.get<double>(cuda::sum_partials()), x, n, /*squares=*/true);
  }
  double do_sum_squares(const float* x, size_t n) override {
    double* partials = norm_scratch_.get<double>(cuda::sum_partials() + 1);
    double* total = partials + cuda::sum_partials();
    CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof(double), compute_stream()));
    cuda::accumulate_sum(total, partials, x, n, /*squares=*/true);
    double result = 0;
    do_copy_to_host(&result, total, sizeof result);
    return result;
  }
  MemoryPool memory_pool() const override {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    char bus[32] = "";
    CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, device));
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    return {name_ + " device memory", free_bytes, total_bytes, std::string(host) + "/" + bus};
  }
  size_t workspace_bytes(int N, int C, int max_width, int B, int T_, int NH) const override {
    return cuda_sizes::workspace_bytes(N, C, max_width, B, T_, NH);  // the same sizes as cuda_footprint()'s
  }
  double measure_gemm_gflops(int n, double seconds) override {
    const size_t elements = static_cast<size_t>(n) * n;
    Element* a = static_cast<Element*>(alloc(3 * elements * sizeof(Element)));
    Element *b = a + elements, *c = b + elements;
    std::vector<float> values(2 * elements);  // not zeros: tensor cores draw less power on zeros
    for (size_t i = 0; i < values.size(); i++) values[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    activations_from_host(reinterpret_cast<Act*>(a), values.data(), values.size());
    cuda::gemm<Element, Element>(false, true, n, n, n, a, b, c, nullptr, false);  // warm-up, algorithm choice
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    int reps = 0;
    double elapsed = 0;
    const auto wall = std::chrono::steady_clock::now();
    CUDA_CHECK(cudaEventRecord(start, compute_stream()));
    do {
      for (int i = 0; i < 10; i++) cuda::gemm<Element, Element>(false, true, n, n, n, a, b, c, nullptr, false);
      reps += 10;
      synchronize();
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
    } while (elapsed < seconds);
    CUDA_CHECK(cudaEventRecord(stop, compute_stream()));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    free(a);
    return 2.0 * n * n * static_cast<double>(n) * reps / (ms / 1e3) / 1e9;
  }

 private:
  // One grouped GEMM's problems in gemm()'s terms: row-major C[M,N] = op(A)[M,K] op(B)[K,N].
  struct GroupedProblems {
    std::vector<int> M, N, K;
    std::vector<const void*> A, B;
    std::vector<void*> C;
    void add(int m, int n, int k, const void* a, const void* b, void* c) {
      M.push_back(m), N.push_back(n), K.push_back(k), A.push_back(a), B.push_back(b), C.push_back(c);
    }
  };
  // As one cuBLAS call (its pointer arrays uploaded), or one gemm() each where grouped_
  // says so: chosen so, or cuBLAS without a grouped GEMM (for these types: the answer is
  // kept for the run). cuBLAS groups inputs and results of one type: fp32 weight gradients
  // from bf16 inputs go one GEMM each.
  template <typename TC>
  void run_grouped(const GroupedProblems& g, bool trans_a, bool trans_b, bool accumulate) {
    const int count = static_cast<int>(g.M.size());
    if (count > 1 && std::is_same_v<TC, Element> && grouped_.use_grouped(cuda::grouped_gemm_available())) {
      std::vector<const void*> pointers(g.A);
      pointers.insert(pointers.end(), g.B.begin(), g.B.end());
      pointers.insert(pointers.end(), g.C.begin(), g.C.end());
      const void** device = pointer_scratch_.get<const void*>(pointers.size());
      upload(device, pointers.data(), pointers.size() * sizeof(void*));
      if (cuda::grouped_gemm<Element, TC>(trans_a, trans_b, count, g.M.data(), g.N.data(), g.K.data(), device,
                                          accumulate))
        return;
      grouped_.not_supported();
    }
    for (int i = 0; i < count; i++)
      cuda::gemm<Element, TC>(trans_a, trans_b, g.M[i], g.N[i], g.K[i], static_cast<const Element*>(g.A[i]),
                              static_cast<const Element*>(g.B[i]), static_cast<TC*>(g.C[i]), nullptr, accumulate);
  }

  static Element* t(Act* p) { return reinterpret_cast<Element*>(p); }
  static const Element* t(const Act* p) { return reinterpret_cast<const Element*>(p); }
  template <typename Arg>
  static Arg t(Arg arg) {  // every other argument as it is
    return arg;
  }

  std::string name_;
  const bool pooled_;
  GroupedGemmChoice grouped_;  // the experts' GEMMs: grouped or one per expert
  Scratch scratch_{pooled_, [this] { count_host_sync(); }}, index_scratch_{pooled_, [this] { count_host_sync(); }},
      norm_scratch_{pooled_, [this] { count_host_sync(); }}, pointer_scratch_{pooled_, [this] { count_host_sync(); }};
  PinnedStaging staging_;
  std::vector<int32_t> csr_count_, csr_packed_, csr_slot_;  // embedding_backward's, kept between calls
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels(Precision precision) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  require(e == cudaSuccess && devices > 0, std::string("device cuda: no usable GPU on this machine (") +
                                               (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) + ")");
  if (precision == Precision::fp32) return std::make_unique<CudaKernels<float>>();
  return std::make_unique<CudaKernels<bf16>>();
}

}  // namespace trident::kernels
