// cuBLASLt's and cuBLAS's entry points from dlopen (cublas_library.h says why).
#include "cublas_library.h"

#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "kernels/base/error.h"

namespace trident::kernels::cuda {

namespace {

// One of the libraries, opened and kept open for the life of the process (its handles
// and kernels are used until exit); resolve() finds its entry points.
class Library {
 public:
  // required: a library that cannot be opened ends the run with one error; else open()
  // says false and why_not() why.
  Library(const std::string& name, const char* what, bool required = true) : name_(name) {
    handle_ = dlopen(name_.c_str(), RTLD_NOW | RTLD_LOCAL);
    const char* why = handle_ == nullptr ? dlerror() : nullptr;
    why_not_ = why != nullptr ? why : "not found";
    require(handle_ != nullptr || !required, "device cuda: cannot open " + name_ + " (" + what +
                                                 ", from the CUDA toolkit or the nvidia-cublas wheel): " + why_not_ +
                                                 "; add its folder to LD_LIBRARY_PATH");
  }
  bool open() const { return handle_ != nullptr; }
  const std::string& why_not() const { return why_not_; }
  template <class F>
  void resolve(F& entry, const char* name) const {
    entry = reinterpret_cast<F>(dlsym(handle_, name));
    require(entry != nullptr, "device cuda: " + name_ + " has no " + name + " (a different cuBLAS version?)");
  }
  // An entry point that older versions lack (null then).
  template <class F>
  void resolve_if_there(F& entry, const char* name) const {
    entry = reinterpret_cast<F>(dlsym(handle_, name));
  }

 private:
  std::string name_, why_not_;
  void* handle_ = nullptr;
};

const std::string kMajor = std::to_string(CUBLAS_VER_MAJOR);

CublasLt load_cublaslt() {
  const Library library("libcublasLt.so." + kMajor, "cuBLASLt");
  CublasLt lt{};
  library.resolve(lt.Create, "cublasLtCreate");
  library.resolve(lt.MatmulDescCreate, "cublasLtMatmulDescCreate");
  library.resolve(lt.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  library.resolve(lt.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  library.resolve(lt.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  library.resolve(lt.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  library.resolve(lt.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  library.resolve(lt.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  library.resolve(lt.Matmul, "cublasLtMatmul");
  library.resolve(lt.MatmulAlgoCheck, "cublasLtMatmulAlgoCheck");
  library.resolve(lt.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  library.resolve(lt.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  return lt;
}

// cuBLAS serves the experts' grouped GEMM alone, which has a fallback (a GEMM per expert,
// cuBLASLt's): without the library, or in one before 12.5, GemmGroupedBatchedEx stays null,
// which grouped_gemm() (gemm.cu) answers with false, and the run goes on, told once.
Cublas load_cublas() {
  const std::string name = "libcublas.so." + kMajor;
  const Library library(name, "cuBLAS", /*required=*/false);
  Cublas blas{};
  if (!library.open()) {
    std::fprintf(stderr,
                 "device cuda: cannot open %s (%s): the grouped GEMM is off; the experts run one GEMM each "
                 "(cuBLASLt)\n",
                 name.c_str(), library.why_not().c_str());
    return blas;
  }
  library.resolve_if_there(blas.Create, "cublasCreate_v2");
  library.resolve_if_there(blas.SetStream, "cublasSetStream_v2");
  library.resolve_if_there(blas.GemmGroupedBatchedEx, "cublasGemmGroupedBatchedEx");  // from cuBLAS 12.5
  if (blas.Create == nullptr || blas.SetStream == nullptr || blas.GemmGroupedBatchedEx == nullptr) {
    std::fprintf(stderr,
                 "device cuda: %s has no cublasGemmGroupedBatchedEx (a cuBLAS before 12.5?): the grouped GEMM is off; "
                 "the experts run one GEMM each (cuBLASLt)\n",
                 name.c_str());
    blas = Cublas{};  // all null: nothing calls into a library half there
  }
  return blas;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt lt = load_cublaslt();  // thread-safe, once
  return lt;
}

const Cublas& cublas() {
  static const Cublas blas = load_cublas();  // once: its message too
  return blas;
}

}  // namespace trident::kernels::cuda
