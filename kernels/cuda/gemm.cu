// GEMM through cuBLASLt: bf16 (or fp32) inputs, fp32 accumulation, optional fused bias,
// fp32 or input-typed output. Algorithms are chosen once per rounded shape and cached, at
// most kMaxPlans of them (gemm_plan_cache.h).
#include <mutex>
#include <tuple>
#include <vector>

#include "cublas_library.h"
#include "cuda_kernels.cuh"
#include "gemm_plan_cache.h"

namespace trident::kernels::cuda {

namespace {

template <typename T>
constexpr cudaDataType_t data_type() {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

constexpr size_t kWorkspaceBytes = cuda_sizes::kGemmWorkspaceBytes;

}  // namespace

size_t gemm_workspace_bytes() { return kWorkspaceBytes; }

void* gemm_workspace() {
  static void* w = [] {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, kWorkspaceBytes));
    return p;
  }();
  return w;
}

namespace {

// The largest power of two (up to 256) that divides the address: what the algorithm
// may assume about each operand.
unsigned alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  unsigned align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// The row-major shapes' column-major layouts (rows x cols, leading dimension): row-major
// C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so cuBLASLt's "A" is our B and
// its "B" our A, with m = N, n = M.
template <typename T, typename TC>
void create_layouts(bool trans_a, bool trans_b, int M, int N, int K, cublasLtMatrixLayout_t& a,
                    cublasLtMatrixLayout_t& b, cublasLtMatrixLayout_t& c) {
  if (trans_b) CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&a, data_type<T>(), K, N, K));
  else CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&a, data_type<T>(), N, K, N));
  if (trans_a) CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&b, data_type<T>(), M, K, M));
  else CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&b, data_type<T>(), K, M, K));
  CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&c, data_type<TC>(), N, M, N));
}

void destroy_layouts(cublasLtMatrixLayout_t& a, cublasLtMatrixLayout_t& b, cublasLtMatrixLayout_t& c) {
  for (cublasLtMatrixLayout_t* layout : {&a, &b, &c})
    if (*layout != nullptr) CUBLAS_CHECK(cublaslt().MatrixLayoutDestroy(*layout));
  a = b = c = nullptr;
}

// cuBLASLt's best algorithm for these layouts, within the workspace and the operands'
// alignments (A, B, C: ours).
cublasLtMatmulAlgo_t heuristic_algo(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                    cublasLtMatrixLayout_t c, const void* A, const void* B, const void* C, int M,
                                    int N, int K) {
  cublasLtMatmulPreference_t preference;
  CUBLAS_CHECK(cublaslt().MatmulPreferenceCreate(&preference));
  const size_t workspace_bytes = kWorkspaceBytes;
  CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof workspace_bytes));
  const uint32_t align_a = alignment_of(B), align_b = alignment_of(A), align_c = alignment_of(C);
  CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                    sizeof align_a));
  CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                    sizeof align_b));
  CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                    sizeof align_c));
  CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                    sizeof align_c));
  cublasLtMatmulHeuristicResult_t result{};
  int found_count = 0;
  CUBLAS_CHECK(
      cublaslt().MatmulAlgoGetHeuristic(cublaslt_handle(), desc, a, b, c, c, preference, 1, &result, &found_count));
  CUBLAS_CHECK(cublaslt().MatmulPreferenceDestroy(preference));
  check(found_count > 0, "cuBLASLt found no algorithm for a " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                             std::to_string(K) + " matmul");
  return result.algo;
}

// One matmul plan (gemm_plan_cache.h): the operation; the layouts of the exact shape last
// run and the algorithm for it (the heuristic's for the key's first shape; for a later
// one the rounded shape's, found once when a second shape comes, where cuBLASLt accepts it).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  bool rounded_known = false;  // a dense layer's one shape never needs it
  cublasLtMatmulAlgo_t rounded_algo{};
  int M = -1, K = -1;  // the exact shape of a, b, c (N is the key's)
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// trans_a, trans_b, M and K rounded (plan_rows: the dimensions that carry an expert's rows,
// M in the forward and input gradient, K in the weight gradient), N, the types, bias,
// accumulate, and the alignments of A, B, C and bias.
using PlanKey = std::tuple<bool, bool, int, int, int, int, int, bool, bool, unsigned, unsigned, unsigned, unsigned>;

constexpr size_t kMaxPlans = 256;

// Never destroyed (plans kept to the process's end, as cuBLASLt itself): their destructor
// would run after cuBLASLt's own at exit.
GemmPlanCache<PlanKey, Plan>& plans() {
  static auto* cache = new GemmPlanCache<PlanKey, Plan>(kMaxPlans, [](Plan& p) {
    destroy_layouts(p.a, p.b, p.c);
    CUBLAS_CHECK(cublaslt().MatmulDescDestroy(p.desc));
  });
  return *cache;
}

std::mutex& plans_mutex() {
  static std::mutex mutex;
  return mutex;
}

template <typename T>
Plan make_plan(bool trans_a, bool trans_b, const T* bias) {
  Plan p;
  CUBLAS_CHECK(cublaslt().MatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = data_type<T>();
    CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    CUBLAS_CHECK(
        cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  }
  return p;
}

// The plan's layouts for the exact shape (M, N, K), and its algorithm: the rounded shape's
// (rounded_M, rounded_K) when cuBLASLt says it runs this one within the workspace, else
// the heuristic's for it.
template <typename T, typename TC>
void set_exact_shape(Plan& p, bool trans_a, bool trans_b, int M, int N, int K, int rounded_M, int rounded_K, const T* A,
                     const T* B, TC* C) {
  if (!p.rounded_known) {
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    create_layouts<T, TC>(trans_a, trans_b, rounded_M, N, rounded_K, a, b, c);
    p.rounded_algo = heuristic_algo(p.desc, a, b, c, A, B, C, rounded_M, N, rounded_K);
    destroy_layouts(a, b, c);
    p.rounded_known = true;
  }
  destroy_layouts(p.a, p.b, p.c);
  create_layouts<T, TC>(trans_a, trans_b, M, N, K, p.a, p.b, p.c);
  p.M = M;
  p.K = K;
  cublasLtMatmulHeuristicResult_t checked{};
  const cublasStatus_t status =
      cublaslt().MatmulAlgoCheck(cublaslt_handle(), p.desc, p.a, p.b, p.c, p.c, &p.rounded_algo, &checked);
  if (status == CUBLAS_STATUS_SUCCESS && checked.state == CUBLAS_STATUS_SUCCESS &&
      checked.workspaceSize <= kWorkspaceBytes)
    p.algo = p.rounded_algo;
  else
    p.algo = heuristic_algo(p.desc, p.a, p.b, p.c, A, B, C, M, N, K);
}

constexpr int kRowChunks = cuda_sizes::kColumnSumRowChunks;  // column sums: row ranges summed by separate blocks

// Block (x, y) of 32 x 32 threads sums 32 columns over row chunk y: each thread every
// 32nd row of the chunk, then the 32 partial sums in order, into partials[y][col].
template <typename T>
__global__ void column_sums_kernel(float* partials, const T* x, int N, int OC) {
  __shared__ float partial[32][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  const int chunk = (N + kRowChunks - 1) / kRowChunks, first = blockIdx.y * chunk;
  const int last = min(N, first + chunk);
  float sum = 0.0f;
  if (col < OC)
    for (int row = first + threadIdx.y; row < last; row += 32) sum += to_float(x[static_cast<size_t>(row) * OC + col]);
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
    float total = 0.0f;
    for (int i = 0; i < 32; i++) total += partial[i][threadIdx.x];
    partials[static_cast<size_t>(blockIdx.y) * OC + col] = total;
  }
}

// bias_grad[col] += the chunks' sums, in order (deterministic).
__global__ void add_column_partials_kernel(float* bias_grad, const float* partials, int OC) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= OC) return;
  float total = 0.0f;
  for (int c = 0; c < kRowChunks; c++) total += partials[static_cast<size_t>(c) * OC + col];
  bias_grad[col] += total;
}

}  // namespace

template <typename T, typename TC>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, const T* A, const T* B, TC* C, const T* bias,
          bool accumulate) {
  const PlanKey key{trans_a, trans_b, plan_rows(M), N, plan_rows(K), static_cast<int>(data_type<T>()),
                    static_cast<int>(data_type<TC>()), bias != nullptr, accumulate, alignment_of(A), alignment_of(B),
                    alignment_of(C), bias != nullptr ? alignment_of(bias) : 256u};
  // One lock for the one cache, whatever the types: the plan is used, and may be changed
  // or evicted, under it.
  std::lock_guard<std::mutex> lock(plans_mutex());
  Plan& p = plans().get(key, [&] { return make_plan<T>(trans_a, trans_b, bias); });
  if (p.M < 0) {  // the key's first shape: the heuristic's algorithm for it exactly (a dense
                  // layer's only shape keeps its own best, not the rounded shape's)
    create_layouts<T, TC>(trans_a, trans_b, M, N, K, p.a, p.b, p.c);
    p.M = M;
    p.K = K;
    p.algo = heuristic_algo(p.desc, p.a, p.b, p.c, A, B, C, M, N, K);
  } else if (p.M != M || p.K != K) {
    set_exact_shape<T, TC>(p, trans_a, trans_b, M, N, K, std::get<2>(key), std::get<4>(key), A, B, C);
  }
  if (bias != nullptr)
    CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  CUBLAS_CHECK(cublaslt().Matmul(cublaslt_handle(), p.desc, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo,
                              gemm_workspace(), kWorkspaceBytes, compute_stream()));
}

bool grouped_gemm_available() { return cublas().GemmGroupedBatchedEx != nullptr; }

template <typename T, typename TC>
bool grouped_gemm(bool trans_a, bool trans_b, int count, const int* M, const int* N, const int* K,
                  const void* const* device_pointers, bool accumulate) {
  if (cublas().GemmGroupedBatchedEx == nullptr) return false;  // a cuBLAS before 12.5
  // Column-major, as gemm(): C^T[N,M] = op(B)^T op(A)^T, so cuBLAS's A is our B.
  const size_t n = static_cast<size_t>(count);
  std::vector<cublasOperation_t> op_a(n, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N), op_b(n, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  std::vector<int> lda(n), ldb(n), ldc(n), group_size(n, 1);
  for (size_t i = 0; i < n; i++) {
    lda[i] = trans_b ? K[i] : N[i];
    ldb[i] = trans_a ? M[i] : K[i];
    ldc[i] = N[i];
  }
  const std::vector<float> alpha(n, 1.0f), beta(n, accumulate ? 1.0f : 0.0f);
  const void* const* ours_a = device_pointers;
  const void* const* ours_b = device_pointers + n;
  void* const* ours_c = const_cast<void* const*>(device_pointers + 2 * n);
  const cublasStatus_t status = cublas().GemmGroupedBatchedEx(
      cublas_handle(), op_a.data(), op_b.data(), N, M, K, alpha.data(), ours_b, data_type<T>(), lda.data(), ours_a,
      data_type<T>(), ldb.data(), beta.data(), ours_c, data_type<TC>(), ldc.data(), count, group_size.data(),
      CUBLAS_COMPUTE_32F);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  CUBLAS_CHECK(status);
  return true;
}

size_t column_sums_scratch_floats(int OC) { return static_cast<size_t>(kRowChunks) * OC; }

template <typename T>
void column_sums(float* bias_grad, const T* x, int N, int OC, float* scratch) {
  column_sums_kernel<<<dim3(blocks_for(OC, 32), kRowChunks), dim3(32, 32), 0, compute_stream()>>>(scratch, x, N, OC);
  CUDA_CHECK_LAUNCH();
  add_column_partials_kernel<<<blocks_for(OC, 256), 256, 0, compute_stream()>>>(bias_grad, scratch, OC);
  CUDA_CHECK_LAUNCH();
}

template void gemm<float, float>(bool, bool, int, int, int, const float*, const float*, float*, const float*, bool);
template void gemm<bf16, bf16>(bool, bool, int, int, int, const bf16*, const bf16*, bf16*, const bf16*, bool);
template void gemm<bf16, float>(bool, bool, int, int, int, const bf16*, const bf16*, float*, const bf16*, bool);
template bool grouped_gemm<float, float>(bool, bool, int, const int*, const int*, const int*, const void* const*,
                                         bool);
template bool grouped_gemm<bf16, bf16>(bool, bool, int, const int*, const int*, const int*, const void* const*, bool);
template bool grouped_gemm<bf16, float>(bool, bool, int, const int*, const int*, const int*, const void* const*, bool);
template void column_sums<float>(float*, const float*, int, int, float*);
template void column_sums<bf16>(float*, const bf16*, int, int, float*);

}  // namespace trident::kernels::cuda
