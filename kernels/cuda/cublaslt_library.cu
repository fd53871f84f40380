// cuBLASLt's entry points from dlopen (cublaslt_library.h says why).
#include "cublaslt_library.h"

#include <dlfcn.h>

#include <string>

#include "kernels/base/error.h"

namespace trident::kernels::cuda {

namespace {

const std::string kLibrary = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);

template <class F>
void resolve(void* library, F& entry, const char* name) {
  entry = reinterpret_cast<F>(dlsym(library, name));
  require(entry != nullptr, "device cuda: " + kLibrary + " has no " + name + " (a different cuBLAS version?)");
}

CublasLt load() {
  // Kept open for the life of the process: its handle and kernels are used until exit.
  void* library = dlopen(kLibrary.c_str(), RTLD_NOW | RTLD_LOCAL);
  const char* why = library == nullptr ? dlerror() : nullptr;
  require(library != nullptr, "device cuda: cannot open " + kLibrary +
                                  " (cuBLASLt, from the CUDA toolkit or the nvidia-cublas wheel): " +
                                  (why != nullptr ? why : "not found") + "; add its folder to LD_LIBRARY_PATH");
  CublasLt lt{};
  resolve(library, lt.Create, "cublasLtCreate");
  resolve(library, lt.MatmulDescCreate, "cublasLtMatmulDescCreate");
  resolve(library, lt.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  resolve(library, lt.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  resolve(library, lt.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  resolve(library, lt.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  resolve(library, lt.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  resolve(library, lt.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  resolve(library, lt.Matmul, "cublasLtMatmul");
  return lt;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt lt = load();  // thread-safe, once
  return lt;
}

}  // namespace trident::kernels::cuda
