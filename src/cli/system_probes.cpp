#include "cli/system_probes.h"

#include "monitor/nvml.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#if __has_include(<rdma/fabric.h>)
#include <rdma/fabric.h>
#define TRIDENT_LIBFABRIC 1
#endif

namespace trident {

namespace {

// The file a dlopen handle came from.
std::string loaded_path(void* handle) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) return map->l_name;
  return "";
}

template <class F>
F symbol(void* handle, const char* name) {
  return reinterpret_cast<F>(dlsym(handle, name));
}

}  // namespace

GpuProbe probe_gpus() {
  GpuProbe p;
  const NvmlApi nvml = load_nvml(p.why_not);
  if (!nvml.usable()) return p;
  if (nvml.init() != nvml::kSuccess) {
    p.why_not = "nvmlInit failed (driver not loaded?)";
    return p;
  }
  p.available = true;
  char text[96] = "";
  if (nvml.driver_version && nvml.driver_version(text, sizeof text) == nvml::kSuccess) p.driver = text;
  unsigned n = 0;
  nvml.device_count(&n);
  for (unsigned i = 0; i < n; i++) {
    NvmlDevice* d = nullptr;
    if (nvml.handle_by_index(i, &d) != nvml::kSuccess) continue;
    GpuInfo g;
    g.index = static_cast<int>(i);
    if (nvml.name(d, text, sizeof text) == nvml::kSuccess) g.name = text;
    NvmlMemory m{};
    if (nvml.memory(d, &m) == nvml::kSuccess) {
      g.memory_gib = static_cast<double>(m.total) / (1ull << 30);
      g.memory_used_gib = static_cast<double>(m.used) / (1ull << 30);
    }
    int current = 0, pending = 0;
    if (nvml.ecc_mode && nvml.ecc_mode(d, &current, &pending) == nvml::kSuccess) g.ecc_enabled = current != 0;
    if (g.ecc_enabled && nvml.ecc_errors)
      nvml.ecc_errors(d, nvml::kUncorrected, nvml::kVolatileCounter, &g.ecc_uncorrected);
    p.gpus.push_back(g);
  }
  nvml.shutdown();
  return p;
}

LibraryProbe probe_nccl() {
  LibraryProbe p;
  p.path = "libnccl.so.2";
  void* nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (nccl == nullptr) return p;
  p.found = true;
  p.path = loaded_path(nccl);
  if (auto version = symbol<int (*)(int*)>(nccl, "ncclGetVersion")) {
    int v = 0;
    version(&v);  // e.g. 22703 = 2.27.3 (major*10000 + minor*100 + patch since 2.9)
    p.version = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }
  return p;
}

LibraryProbe probe_nccl_net_plugin() {
  LibraryProbe p;
  std::vector<std::string> names;
  if (const char* plugin = std::getenv("NCCL_NET_PLUGIN"); plugin != nullptr && *plugin != '\0') {
    const std::string n = plugin;
    names.push_back(n.find(".so") != std::string::npos ? n : "libnccl-net-" + n + ".so");
  }
  names.insert(names.end(), {"libnccl-net.so", "libnccl-net-ofi.so", "libnccl-net-aws-ofi.so"});
  for (const std::string& n : names) {
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      p.found = true;
      p.path = loaded_path(h);
      return p;
    }
  }
  p.path = names.front();
  return p;
}

FabricProbe probe_fabric() {
  FabricProbe p;
#ifdef TRIDENT_LIBFABRIC
  // Opened, not linked: trident runs where libfabric is absent, and uses the one the
  // machine has (on EFA instances, /opt/amazon/efa's) where it is there.
  void* fabric = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  if (fabric == nullptr) {
    p.why_not = "libfabric.so.1 not found";
    return p;
  }
  auto version = symbol<uint32_t (*)()>(fabric, "fi_version");
  auto getinfo = symbol<int (*)(uint32_t, const char*, const char*, uint64_t, const fi_info*, fi_info**)>(fabric, "fi_getinfo");
  auto freeinfo = symbol<void (*)(fi_info*)>(fabric, "fi_freeinfo");
  auto dupinfo = symbol<fi_info* (*)(const fi_info*)>(fabric, "fi_dupinfo");
  auto strerror = symbol<const char* (*)(int)>(fabric, "fi_strerror");
  if (!version || !getinfo || !freeinfo || !dupinfo || !strerror) {
    p.why_not = "libfabric.so.1 lacks fi_getinfo and friends";
    return p;
  }
  const uint32_t v = version();
  p.version = std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v)) + " (" + loaded_path(fabric) + ")";
  fi_info* info = nullptr;
  const int rc = getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, nullptr, &info);
  if (rc != 0) {
    p.why_not = std::string("fi_getinfo: ") + strerror(-rc);
    return p;
  }
  p.available = true;
  for (fi_info* i = info; i != nullptr; i = i->next) {
    if (i->fabric_attr == nullptr || i->fabric_attr->prov_name == nullptr) continue;
    const std::string prov = i->fabric_attr->prov_name;
    if (std::find(p.providers.begin(), p.providers.end(), prov) == p.providers.end()) p.providers.push_back(prov);
    if (prov == "efa") {
      p.efa = true;
      if (i->caps & FI_HMEM) p.efa_hmem = true;
    }
  }
  freeinfo(info);
  // Providers report FI_HMEM only when asked for it (older efa clears it otherwise).
  if (p.efa && !p.efa_hmem) {
    fi_info* hints = dupinfo(nullptr);
    hints->caps = FI_HMEM;
    hints->domain_attr->mr_mode = FI_MR_HMEM | FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup("efa");
    fi_info* hmem = nullptr;
    if (getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr, 0, hints, &hmem) == 0) {
      p.efa_hmem = hmem != nullptr;
      freeinfo(hmem);
    }
    freeinfo(hints);  // frees prov_name too
  }
#else
  p.why_not = "built without libfabric's headers (libfabric-dev)";
#endif
  return p;
}

}  // namespace trident
