// What real bf16 GEMMs would give the CPU path (issue 43), before it is built: oneDNN's
// matmul primitive on bf16 inputs with fp32 output (fp32 accumulation), against the sgemm
// the CPU kernels use today (dnnl_sgemm), on GPT-2 124M's forward GEMM shapes, in one run.
// Prints the implementation oneDNN chose (brg:avx512_core_bf16 / amx where the CPU has
// them; a reference or converting one where it has not) and the CPU's bf16 flags.
// Usage: build/bench/bf16_gemm [--tokens=2048] [--repeats=10]
#include <oneapi/dnnl/dnnl.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench_common.h"

namespace {

uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

template <class F>
double seconds_per_call(F call, int repeats) {
  call();  // warm-up: the primitive's first run, the pages
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; i++) call();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
}

std::string cpu_bf16_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, found;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      for (const char* flag : {"avx512_bf16", "amx_bf16", "avx512f", "avx2"})
        if ((" " + line + " ").find(std::string(" ") + flag + " ") != std::string::npos) found += std::string(flag) + " ";
      break;
    }
  return found.empty() ? "none of avx512_bf16 amx_bf16 avx512f avx2" : found;
}

}  // namespace

int main(int argc, char** argv) {
  int tokens = 2048, repeats = 10;
  for (int i = 1; i < argc; i++) {
    if (std::strncmp(argv[i], "--tokens=", 9) == 0) tokens = std::atoi(argv[i] + 9);
    else if (std::strncmp(argv[i], "--repeats=", 10) == 0) repeats = std::atoi(argv[i] + 10);
    else {
      std::fprintf(stderr, "bf16_gemm: unknown argument '%s' (--tokens=N --repeats=N)\n", argv[i]);
      return 2;
    }
  }
  struct Shape {
    const char* name;
    int K, N;  // [tokens, K] x [K, N]
  };
  const Shape shapes[] = {{"qkv", 768, 2304}, {"attention proj", 768, 768}, {"mlp fc", 768, 3072},
                          {"mlp proj", 3072, 768}, {"lm head", 768, 50304}};
  using namespace dnnl;
  engine cpu(engine::kind::cpu, 0);
  stream s(cpu);
  std::printf("bf16_gemm: %d tokens, %d repeats, cpu flags: %s, load %s\n", tokens, repeats, cpu_bf16_flags().c_str(),
              trident::bench::load_average().c_str());
  std::printf("| GEMM | M x K x N | sgemm GFLOP/s | bf16 matmul GFLOP/s | bf16 / sgemm | oneDNN's bf16 kernel |\n");
  std::printf("| --- | --- | ---: | ---: | ---: | --- |\n");
  double fp32_s = 0, bf16_s = 0;
  for (const Shape& g : shapes) {
    const int M = tokens, K = g.K, N = g.N;
    std::vector<float> a(static_cast<size_t>(M) * K), b(static_cast<size_t>(K) * N), c(static_cast<size_t>(M) * N);
    for (size_t i = 0; i < a.size(); i++) a[i] = static_cast<float>(i % 13) * 0.01f;
    for (size_t i = 0; i < b.size(); i++) b[i] = static_cast<float>(i % 7) * 0.02f;
    std::vector<uint16_t> a16(a.size()), b16(b.size());
    for (size_t i = 0; i < a.size(); i++) a16[i] = to_bf16(a[i]);
    for (size_t i = 0; i < b.size(); i++) b16[i] = to_bf16(b[i]);
    const double sgemm = seconds_per_call(
        [&] { dnnl_sgemm('N', 'N', M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N); }, repeats);
    const memory::desc ad({M, K}, memory::data_type::bf16, memory::format_tag::ab);
    const memory::desc bd({K, N}, memory::data_type::bf16, memory::format_tag::ab);
    const memory::desc cd({M, N}, memory::data_type::f32, memory::format_tag::ab);
#if DNNL_VERSION_MAJOR >= 3
    const matmul::primitive_desc pd(cpu, ad, bd, cd);
#else
    const matmul::primitive_desc pd(matmul::desc(ad, bd, cd), cpu);
#endif
    const matmul mm(pd);
    memory am(ad, cpu, a16.data()), bm(bd, cpu, b16.data()), cm(cd, cpu, c.data());
    const double bf16 = seconds_per_call(
        [&] {
          mm.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
          s.wait();
        },
        repeats);
    const double flops = 2.0 * M * N * K;
    fp32_s += sgemm;
    bf16_s += bf16;
    std::printf("| %s | %d x %d x %d | %.1f | %.1f | %.2fx | %s |\n", g.name, M, K, N, flops / sgemm / 1e9,
                flops / bf16 / 1e9, sgemm / bf16, pd.impl_info_str());
  }
  std::printf("all five: bf16 %.2fx the sgemm's speed\n", fp32_s / bf16_s);
  return 0;
}
