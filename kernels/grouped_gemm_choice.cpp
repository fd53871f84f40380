#include "kernels/grouped_gemm_choice.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "kernels/footprint.h"

namespace trident::kernels {

GroupedGemmSetting parse_grouped_gemm_setting(const char* value) {
  if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0) return GroupedGemmSetting::automatic;
  if (std::strcmp(value, "grouped") == 0) return GroupedGemmSetting::grouped;
  if (std::strcmp(value, "per_expert") == 0) return GroupedGemmSetting::per_expert;
  throw UsageError(std::string("TRIDENT_GROUPED_GEMM=") + value + ": expected auto, grouped or per_expert");
}

const char* grouped_gemm_setting_name(GroupedGemmSetting s) {
  switch (s) {
    case GroupedGemmSetting::grouped: return "grouped";
    case GroupedGemmSetting::per_expert: return "per_expert";
    case GroupedGemmSetting::automatic: break;
  }
  return "auto";
}

namespace {

// The file's JSON; null where there is no file.
nlohmann::json read_choices(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    require(j.is_object(), "not a JSON object");
    return j;
  } catch (const std::exception& e) {
    throw UsageError("GPU choices file " + path + " (TRIDENT_GPU_CHOICES): " + e.what() +
                     " (kernel_check --record writes it)");
  }
}

std::string ms(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f ms", v);
  return text;
}

}  // namespace

void record_grouped_gemm(const std::string& path, Precision precision, const GroupedGemmMeasurement& m) {
  nlohmann::json j = read_choices(path);
  if (j.is_null()) j = nlohmann::json::object();
  j["grouped_gemm"][precision_name(precision)] = {{"device", m.device},
                                                  {"grouped_ms", m.grouped_ms},
                                                  {"per_expert_ms", m.per_expert_ms},
                                                  {"grouped_ran", m.grouped_ran},
                                                  {"choice", m.grouped_wins() ? "grouped" : "per_expert"}};
  std::ofstream out(path);
  require(static_cast<bool>(out << j.dump(2) << '\n'), "cannot write the GPU choices file " + path);
}

std::optional<GroupedGemmMeasurement> read_grouped_gemm_record(const std::string& path, Precision precision) {
  const nlohmann::json j = read_choices(path);
  if (j.is_null() || !j.contains("grouped_gemm") || !j["grouped_gemm"].contains(precision_name(precision)))
    return std::nullopt;
  try {
    const nlohmann::json& e = j["grouped_gemm"][precision_name(precision)];
    return GroupedGemmMeasurement{e.at("device").get<std::string>(), e.at("grouped_ms").get<double>(),
                                  e.at("per_expert_ms").get<double>(), e.value("grouped_ran", true)};
  } catch (const std::exception& e) {
    throw UsageError("GPU choices file " + path + ", grouped_gemm." + precision_name(precision) + ": " + e.what());
  }
}

GroupedGemmChoice::GroupedGemmChoice(GroupedGemmSetting setting, const std::optional<GroupedGemmMeasurement>& record,
                                     const std::string& device, Log log)
    : log_(std::move(log)) {
  if (setting != GroupedGemmSetting::automatic) {
    set(setting);
    return;
  }
  if (!record) {
    description_ = "grouped GEMMs: grouped (auto: no measurement recorded)";
  } else if (record->device != device) {
    description_ = "grouped GEMMs: grouped (auto: the measurement recorded is of " + record->device + ", not " +
                   device + ")";
  } else {
    want_grouped_ = record->grouped_wins();
    description_ = std::string("grouped GEMMs: ") + (want_grouped_ ? "grouped" : "per expert") +
                   " (auto, measured: grouped " + (record->grouped_ran ? ms(record->grouped_ms) : "not supported") +
                   ", per expert " + ms(record->per_expert_ms) + ")";
  }
}

GroupedGemmChoice GroupedGemmChoice::from_environment(const std::string& device, Precision precision, Log log) {
  const GroupedGemmSetting setting = parse_grouped_gemm_setting(std::getenv("TRIDENT_GROUPED_GEMM"));
  const char* path = std::getenv("TRIDENT_GPU_CHOICES");
  std::optional<GroupedGemmMeasurement> record;
  if (setting == GroupedGemmSetting::automatic && path != nullptr && *path != '\0')
    record = read_grouped_gemm_record(path, precision);
  return GroupedGemmChoice(setting, record, device, std::move(log));
}

bool GroupedGemmChoice::use_grouped(bool available) {
  if (!want_grouped_ || off_) return false;
  if (!available) {
    turn_off("this cuBLAS has no cublasGemmGroupedBatchedEx (cuBLAS 12.5 or later has)");
    return false;
  }
  return true;
}

void GroupedGemmChoice::not_supported() {
  if (!off_) turn_off("cuBLAS answered CUBLAS_STATUS_NOT_SUPPORTED for a grouped GEMM");
}

void GroupedGemmChoice::set(GroupedGemmSetting setting) {
  want_grouped_ = setting != GroupedGemmSetting::per_expert;
  off_ = false;
  description_ = std::string("grouped GEMMs: ") + (want_grouped_ ? "grouped" : "per expert") +
                 " (TRIDENT_GROUPED_GEMM=" + grouped_gemm_setting_name(setting) + ")";
}

void GroupedGemmChoice::turn_off(const std::string& why) {
  off_ = true;
  description_ = "grouped GEMMs: per expert (" + why + ")";
  if (log_) log_(why + ": the experts' GEMMs go one per expert from now on");
}

}  // namespace trident::kernels
