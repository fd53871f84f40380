// Document masking's speed-up (data.document_mask): the CPU attention kernel's forward +
// backward on a sequence of packed documents, causal against document-masked, at T = 1K,
// 4K, 16K tokens.
//
//   OMP_NUM_THREADS=1 build/bench/document_mask [--data=build/data/fortunes] [--T=1024,4096,16384] [--reps=N]
//
// The sequences are the default job's data as training reads it: the first T tokens of
// the prepared Megatron dataset (`make data`: the fortunes in SentencePiece tokens, each
// document ending with the tokenizer's </s>, whose id the dataset's .json names), their
// document starts found by the model's own document_starts(). The layer is context
// parallelism's benchmark's (benchmarks/context_parallel.cpp): 8 query heads, 2 key/value
// heads, head dimension 64, B = 1, fp32, Kernels::attention_forward/backward of
// make_cpu_kernels() with positions 0..T-1, the mask's document starts null (causal) or
// set (masked).
//
// Against what: the causal run in the same process, and two fractions of the causal key
// range (sum over query rows i of i+1 keys): the keys the kernel visits (it multiplies a
// chunk of 128 rows against the hull of their visible keys, from the chunk's first row's
// document start to its last row: kernels/cpu/attention.cpp, replayed here), and the
// keys the mask lets through (each row's own document): one over the first is the
// speed-up at equal work per key; the second is what a kernel of finer blocks could
// approach. And each run's GEMM rate on the pairs it multiplies, beside the GEMM rate
// of n = 1024 matrices measured in the same run.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "bench_common.h"
#include "kernels/base/memory.h"
#include "kernels/device_buffer.h"
#include "kernels/kernels.h"
#include "model/document_mask.h"
#include "runtime/random.h"
#include "runtime/timer.h"

using namespace trident;
using kernels::Act;
using kernels::DeviceBuffer;

namespace {

constexpr int B = 1, NH = 8, NKV = 2, HD = 64, kChunk = 128;
constexpr int kQkvWidth = (NH + 2 * NKV) * HD, kOutWidth = NH * HD;

Act* act(DeviceBuffer& b) { return reinterpret_cast<Act*>(b.data()); }

void fill(DeviceBuffer& buffer, size_t n, uint64_t stream) {
  for (size_t i = 0; i < n; i++)
    buffer.data()[i] = static_cast<float>(static_cast<double>(hash_key(7, stream, i) >> 11) * 0x1.0p-52 - 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory();
  std::string prefix = "build/data/fortunes";
  std::vector<int> lengths = {1024, 4096, 16384};
  int reps = 0;  // 0: 3 below 16K tokens, 1 from there
  for (int i = 1; i < argc; i++) {
    if (!std::strncmp(argv[i], "--data=", 7)) prefix = argv[i] + 7;
    else if (!std::strncmp(argv[i], "--T=", 4)) lengths = bench::parse_int_list(argv[i] + 4);
    else if (!std::strncmp(argv[i], "--reps=", 7)) reps = std::atoi(argv[i] + 7);
    else {
      std::fprintf(stderr, "usage: %s [--data=PREFIX] [--T=1024,4096,...] [--reps=N]\n", argv[0]);
      return 2;
    }
  }
  const IndexedDataset data(prefix);
  std::ifstream sidecar(prefix + ".json");
  const int32_t eod = nlohmann::json::parse(sidecar).at("tokenizer").at("eod").get<int32_t>();
  auto k = kernels::make_cpu_kernels();
  const double gemm = k->measure_gemm_gflops(1024, 1.0);
  std::printf("data %s: %zu documents, %llu tokens (%.1f per document), eod id %d; GEMM rate %.1f GFLOP/s "
              "(n = 1024)\n\n",
              prefix.c_str(), data.documents(), static_cast<unsigned long long>(data.tokens()),
              static_cast<double>(data.tokens()) / data.documents(), eod, gemm);
  std::printf("| T | documents in the sequence | causal fwd+bwd (ms) | masked fwd+bwd (ms) | speed-up | keys visited / "
              "causal | 1 / that | keys in the mask / causal | GFLOP/s causal | GFLOP/s masked |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  bool warm = false;
  for (int T : lengths) {
    std::vector<int32_t> tokens(static_cast<size_t>(B) * T), starts(tokens.size()), positions(T);
    data.read(0, tokens.size(), tokens.data());
    document_starts(tokens.data(), B, T, eod, starts.data());
    std::iota(positions.begin(), positions.end(), 0);
    // The key ranges: causal (row i sees i+1 keys), in the mask, and what the kernel's
    // 128-row chunks multiply (hull: first row's document start .. last row).
    double causal = 0, in_mask = 0, visited = 0, causal_chunks = 0;
    for (int i = 0; i < T; i++) causal += i + 1, in_mask += i + 1 - starts[i];
    for (int r0 = 0; r0 < T; r0 += kChunk) {
      const int r1 = std::min(r0 + kChunk, T);
      visited += static_cast<double>(r1 - r0) * (r1 - starts[r0]);
      causal_chunks += static_cast<double>(r1 - r0) * r1;
    }
    int documents = 1;
    for (int i = 0; i + 1 < T; i++) documents += tokens[i] == eod;

    const size_t rows = static_cast<size_t>(B) * T;
    DeviceBuffer qkv(*k, rows * kQkvWidth), out(*k, rows * kOutWidth), dout(*k, rows * kOutWidth),
        dqkv(*k, rows * kQkvWidth), lse(*k, k->attention_stats_floats(B, T, NH)), pos(*k, T), doc(*k, rows);
    fill(qkv, rows * kQkvWidth, 1);
    fill(dout, rows * kOutWidth, 2);
    k->copy_to_device(pos.data(), positions.data(), T * sizeof(int32_t));
    k->copy_to_device(doc.data(), starts.data(), rows * sizeof(int32_t));
    const int32_t* p = reinterpret_cast<const int32_t*>(pos.data());
    const size_t kv_column = static_cast<size_t>(NH) * HD;
    Act* kv = kernels::offset(act(qkv), kv_column, k->activation_type());
    Act* dkv = kernels::offset(act(dqkv), kv_column, k->activation_type());
    const auto pass = [&](const kernels::AttentionMask& mask) {
      k->attention_forward(act(out), lse.data(), act(qkv), kv, kQkvWidth, mask, B, T, T, NH, NKV, HD);
      k->attention_backward(act(dqkv), dkv, act(dout), act(qkv), kv, kQkvWidth, act(out), lse.data(), mask, B, T, T,
                            NH, NKV, HD);
    };
    const kernels::AttentionMask plain{p, p, nullptr};
    const kernels::AttentionMask masked{p, p, reinterpret_cast<const int32_t*>(doc.data())};
    const int n = reps > 0 ? reps : (T < 16384 ? 3 : 1);
    if (!warm || n > 1) pass(plain), pass(masked), warm = true;  // the kernels' first calls
    double seconds[2] = {};
    for (int rep = 0; rep < n; rep++)  // alternating, so that drift of the machine hits both
      for (int m = 0; m < 2; m++) {
        Timer timer;
        pass(m == 0 ? plain : masked);
        seconds[m] += timer.seconds() / n;
      }
    // The rate of each on the (row, key) pairs its chunks multiply: 14 NH HD flops a pair
    // (forward QK^T and PV, backward the scores again, dV, dP, dQ, dK: 7 GEMMs of 2 HD each).
    const double flops_per_pair = 14.0 * NH * HD;
    std::printf("| %d | %d | %.1f | %.1f | %.2f | %.3f | %.1f | %.3f | %.1f | %.1f |\n", T, documents,
                1e3 * seconds[0], 1e3 * seconds[1], seconds[0] / seconds[1], visited / causal_chunks,
                causal_chunks / visited, in_mask / causal, flops_per_pair * causal_chunks / seconds[0] / 1e9,
                flops_per_pair * visited / seconds[1] / 1e9);
  }
  std::printf("\n(mean of the repetitions; load average at the end: %s)\n", bench::load_average().c_str());
  return 0;
}
