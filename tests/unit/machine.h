// What this machine has, asked of the machine itself rather than told by the
// environment: tests whose expectations differ with a GPU (or its driver) choose here.
#pragma once

#include <dlfcn.h>

#include "kernels/kernels.h"

namespace trident::test {

// A GPU this build can use (0 without CUDA in the build, or without a GPU).
inline bool machine_has_gpu() { return kernels::cuda_device_count() > 0; }

// NVIDIA's driver library, which doctor reads (present with a driver, even without CUDA in the build).
inline bool machine_has_nvml() {
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml != nullptr) dlclose(nvml);
  return nvml != nullptr;
}

}  // namespace trident::test
