// cuBLASLt's and cuBLAS's entry points from dlopen (cublas_library.h says why).
#include "cublas_library.h"

#include <dlfcn.h>

#include <string>

#include "kernels/base/error.h"

namespace trident::kernels::cuda {

namespace {

// One of the libraries, opened and kept open for the life of the process (its handles
// and kernels are used until exit); resolve() finds its entry points.
class Library {
 public:
  Library(const std::string& name, const char* what) : name_(name) {
    handle_ = dlopen(name_.c_str(), RTLD_NOW | RTLD_LOCAL);
    const char* why = handle_ == nullptr ? dlerror() : nullptr;
    require(handle_ != nullptr, "device cuda: cannot open " + name_ + " (" + what +
                                    ", from the CUDA toolkit or the nvidia-cublas wheel): " +
                                    (why != nullptr ? why : "not found") + "; add its folder to LD_LIBRARY_PATH");
  }
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
  std::string name_;
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

Cublas load_cublas() {
  const Library library("libcublas.so." + kMajor, "cuBLAS");
  Cublas blas{};
  library.resolve(blas.Create, "cublasCreate_v2");
  library.resolve(blas.SetStream, "cublasSetStream_v2");
  library.resolve_if_there(blas.GemmGroupedBatchedEx, "cublasGemmGroupedBatchedEx");  // from cuBLAS 12.5
  return blas;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt lt = load_cublaslt();  // thread-safe, once
  return lt;
}

const Cublas& cublas() {
  static const Cublas blas = load_cublas();
  return blas;
}

}  // namespace trident::kernels::cuda
