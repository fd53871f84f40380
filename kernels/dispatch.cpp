// Picks the kernel backend at run time: `--train.device=cpu|cuda`, `--train.precision`.
#include "kernels/kernels.h"

#include "kernels/base/error.h"

namespace trident::kernels {

const char* precision_name(Precision p) { return p == Precision::fp32 ? "fp32" : "bf16"; }

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  throw UsageError("precision must be fp32 or bf16, got '" + name + "'");
}

#ifndef TRIDENT_CUDA
namespace {
[[noreturn]] void no_cuda() {
  throw UsageError("device cuda: this build has no CUDA path (nvcc was not found when it was built; "
                   "rebuild with CUDA_HOME=/path/to/cuda)");
}
}  // namespace

bool cuda_compiled_in() { return false; }
int cuda_device_count() { return 0; }
std::unique_ptr<Kernels> make_cuda_kernels(Precision) { no_cuda(); }
void select_cuda_device(int) { no_cuda(); }
#endif

std::unique_ptr<Kernels> make_kernels(Device device, Precision precision) {
  return device == Device::cuda ? make_cuda_kernels(precision) : make_cpu_kernels(precision);
}

}  // namespace trident::kernels
