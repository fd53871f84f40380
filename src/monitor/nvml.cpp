#include "monitor/nvml.h"

#include <dlfcn.h>

namespace trident {

namespace {

template <class F>
void bind(void* library, F& function, const char* symbol) {
  function = reinterpret_cast<F>(dlsym(library, symbol));
}

}  // namespace

NvmlApi load_nvml(std::string& why_not) {
  NvmlApi api;
  void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);  // kept open: the functions are used
  if (library == nullptr) {
    why_not = "libnvidia-ml.so.1 not found (no NVIDIA driver)";
    return api;
  }
  bind(library, api.init, "nvmlInit_v2");
  bind(library, api.shutdown, "nvmlShutdown");
  bind(library, api.driver_version, "nvmlSystemGetDriverVersion");
  bind(library, api.device_count, "nvmlDeviceGetCount_v2");
  bind(library, api.handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  bind(library, api.name, "nvmlDeviceGetName");
  bind(library, api.uuid, "nvmlDeviceGetUUID");
  bind(library, api.memory, "nvmlDeviceGetMemoryInfo");
  bind(library, api.utilization, "nvmlDeviceGetUtilizationRates");
  bind(library, api.temperature, "nvmlDeviceGetTemperature");
  bind(library, api.power, "nvmlDeviceGetPowerUsage");
  bind(library, api.clock, "nvmlDeviceGetClockInfo");
  bind(library, api.throttle_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
  bind(library, api.ecc_mode, "nvmlDeviceGetEccMode");
  bind(library, api.ecc_errors, "nvmlDeviceGetTotalEccErrors");
  bind(library, api.event_set_create, "nvmlEventSetCreate");
  bind(library, api.register_events, "nvmlDeviceRegisterEvents");
  bind(library, api.event_set_wait, "nvmlEventSetWait_v2");
  bind(library, api.event_set_free, "nvmlEventSetFree");
  if (!api.usable()) {
    why_not = "libnvidia-ml.so.1 lacks the NVML functions used";
    return NvmlApi{};
  }
  return api;
}

}  // namespace trident
