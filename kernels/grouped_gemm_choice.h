// Whether the CUDA backend runs a mixture's expert GEMMs (grouped_matmul_*) as one cuBLAS
// grouped GEMM per pass or as one GEMM per expert. Which is faster depends on the GPU and
// the cuBLAS release, so it follows a measurement:
//
//   TRIDENT_GROUPED_GEMM=auto|grouped|per_expert   (unset: auto)
//     auto: what `kernel_check --record PATH` measured on this GPU model, read from the
//     file named by TRIDENT_GPU_CHOICES (unset, absent, or measured on another GPU: grouped).
//
// Grouped needs cuBLAS 12.5's cublasGemmGroupedBatchedEx; where it is missing, or where
// cuBLAS answers CUBLAS_STATUS_NOT_SUPPORTED, the expert GEMMs go one at a time for the
// rest of the run, said once. Host-only: tested without a GPU (tests/unit/test_grouped_gemm_choice.cpp).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "kernels/dtype.h"

namespace trident::kernels {

enum class GroupedGemmSetting : int { automatic, grouped, per_expert };

// TRIDENT_GROUPED_GEMM's value (null or "": auto); UsageError naming the allowed values otherwise.
GroupedGemmSetting parse_grouped_gemm_setting(const char* value);
const char* grouped_gemm_setting_name(GroupedGemmSetting s);

// One precision's measurement at a mixture's expert shapes: forward + backward, each way.
struct GroupedGemmMeasurement {
  std::string device;  // the GPU's model (cudaDeviceProp::name): another model may differ
  double grouped_ms = 0, per_expert_ms = 0;
  bool grouped_ran = true;  // false: cuBLAS refused the grouped GEMM, the row ran per expert
  bool grouped_wins() const { return grouped_ran && grouped_ms <= per_expert_ms; }
};

// The JSON file of GPU choices: {"grouped_gemm": {"bf16": {...}, "fp32": {...}}}. Writing
// keeps the other entries; reading gives nullopt where the file or the entry is absent and
// a UsageError naming the file where it is not such JSON.
void record_grouped_gemm(const std::string& path, Precision precision, const GroupedGemmMeasurement& m);
std::optional<GroupedGemmMeasurement> read_grouped_gemm_record(const std::string& path, Precision precision);

class GroupedGemmChoice {
 public:
  using Log = std::function<void(const std::string&)>;  // a line for the run's log

  // `record`: the measurement for this precision, if any; `device`: this GPU's model.
  GroupedGemmChoice(GroupedGemmSetting setting, const std::optional<GroupedGemmMeasurement>& record,
                    const std::string& device, Log log);
  // TRIDENT_GROUPED_GEMM and the record at $TRIDENT_GPU_CHOICES.
  static GroupedGemmChoice from_environment(const std::string& device, Precision precision, Log log);

  // Whether to try the grouped GEMM; `available`: cuBLAS has its entry point. Where it has
  // not, grouped is off from now on and that is logged, once.
  bool use_grouped(bool available);
  // cuBLAS answered CUBLAS_STATUS_NOT_SUPPORTED: one GEMM per expert from now on, logged once.
  void not_supported();
  // A setting that replaces the first one (kernel_check times both ways); it clears an
  // earlier "not supported", which another shape may have caused.
  void set(GroupedGemmSetting setting);

  bool grouped_off() const { return off_; }
  // Whether the next grouped call tries the grouped GEMM (where cuBLAS has it).
  bool on() const { return want_grouped_ && !off_; }
  // The choice and why, for the run's startup line ("grouped GEMMs: per expert (measured ...)").
  const std::string& description() const { return description_; }

 private:
  void turn_off(const std::string& why);

  bool want_grouped_ = true, off_ = false;
  std::string description_;
  Log log_;
};

}  // namespace trident::kernels
