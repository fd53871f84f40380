// NVML, the NVIDIA driver's management library, as trident calls it: the C functions it
// uses, in a table that load_nvml() fills from libnvidia-ml.so.1 at run time (one binary
// runs where there is no driver), and that a test fills with its own functions to stand
// in for a GPU. Types and constants as nvml.h declares them (stable since CUDA 5), here
// because the header comes with a CUDA toolkit a CPU machine need not have.
#pragma once

#include <string>

namespace trident {

struct NvmlDevice;
struct NvmlEventSet;
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlUtilization {
  unsigned gpu, memory;  // percent of the last sample period
};
struct NvmlEventData {
  NvmlDevice* device;
  unsigned long long event_type, event_data;  // event_data: the XID
  unsigned gpu_instance_id, compute_instance_id;
};

namespace nvml {
constexpr int kSuccess = 0, kTimeout = 10;
constexpr int kTemperatureGpu = 0;       // nvmlTemperatureSensors_t
constexpr int kClockSm = 1;              // nvmlClockType_t
constexpr int kUncorrected = 1;          // nvmlMemoryErrorType_t
constexpr int kVolatileCounter = 0;      // nvmlEccCounterType_t: since the driver loaded
constexpr unsigned long long kXidCriticalError = 0x8;  // nvmlEventTypeXidCriticalError
}  // namespace nvml

struct NvmlApi {
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*driver_version)(char*, unsigned) = nullptr;
  int (*device_count)(unsigned*) = nullptr;
  int (*handle_by_index)(unsigned, NvmlDevice**) = nullptr;
  int (*name)(NvmlDevice*, char*, unsigned) = nullptr;
  int (*uuid)(NvmlDevice*, char*, unsigned) = nullptr;
  int (*memory)(NvmlDevice*, NvmlMemory*) = nullptr;
  int (*utilization)(NvmlDevice*, NvmlUtilization*) = nullptr;
  int (*temperature)(NvmlDevice*, int sensor, unsigned* celsius) = nullptr;
  int (*power)(NvmlDevice*, unsigned* milliwatts) = nullptr;
  int (*clock)(NvmlDevice*, int type, unsigned* mhz) = nullptr;
  int (*throttle_reasons)(NvmlDevice*, unsigned long long*) = nullptr;
  int (*ecc_mode)(NvmlDevice*, int* current, int* pending) = nullptr;
  int (*ecc_errors)(NvmlDevice*, int error_type, int counter_type, unsigned long long*) = nullptr;
  int (*event_set_create)(NvmlEventSet**) = nullptr;
  int (*register_events)(NvmlDevice*, unsigned long long types, NvmlEventSet*) = nullptr;
  int (*event_set_wait)(NvmlEventSet*, NvmlEventData*, unsigned timeout_ms) = nullptr;
  int (*event_set_free)(NvmlEventSet*) = nullptr;
  // The essentials are there (the rest may be absent on old drivers: those figures are left out).
  bool usable() const { return init && shutdown && device_count && handle_by_index && name && memory; }
};

// libnvidia-ml.so.1's functions; an empty table and why_not when there is no driver.
NvmlApi load_nvml(std::string& why_not);

}  // namespace trident
