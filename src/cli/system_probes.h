// What `trident doctor` asks the machine: the GPUs through NVML, NCCL and its network
// plugin, libfabric's providers. Each library is opened at run time (dlopen), so one
// binary checks a GPU node and a CPU box alike and says what is absent.
#pragma once

#include <string>
#include <vector>

namespace trident {

struct GpuInfo {
  int index = 0;
  std::string name;
  double memory_gib = 0, memory_used_gib = 0;
  bool ecc_enabled = false;
  unsigned long long ecc_uncorrected = 0;  // volatile (since the driver loaded)
};

struct GpuProbe {
  bool available = false;  // NVML loaded and initialized
  std::string why_not;     // when not available
  std::string driver;
  std::vector<GpuInfo> gpus;
};
GpuProbe probe_gpus();

struct LibraryProbe {
  bool found = false;
  std::string version;  // e.g. NCCL "2.27.3"
  std::string path;     // the file that was loaded, or what was looked for
};
LibraryProbe probe_nccl();
// The NCCL network plugin (aws-ofi-nccl): NCCL_NET_PLUGIN's library, else libnccl-net.so.
LibraryProbe probe_nccl_net_plugin();

struct FabricProbe {
  bool available = false;  // libfabric present (compiled in and fi_getinfo answered)
  std::string why_not;
  std::string version;
  std::vector<std::string> providers;  // distinct provider names, in fi_getinfo's order
  bool efa = false, efa_hmem = false;   // the efa provider; with FI_HMEM (GPUDirect RDMA)
};
FabricProbe probe_fabric();

}  // namespace trident
