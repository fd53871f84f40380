#include "train/metrics_log.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "monitor/prometheus_exporter.h"
#include "monitor/tensorboard.h"
#include "runtime/durable_file.h"
#include "runtime/timer.h"
#include "kernels/base/error.h"

namespace trident {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char out[32];
  if (s >= 3600) std::snprintf(out, sizeof out, "%ldh%02ldm", s / 3600, s % 3600 / 60);
  else if (s >= 60) std::snprintf(out, sizeof out, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(out, sizeof out, "%lds", s);
  return out;
}

std::vector<MetricValue> metric_values(const StepMetrics& m) {
  const double values[] = {static_cast<double>(m.step), m.loss, m.loss_step, m.lr, m.grad_norm, m.step_time_s,
                           m.tokens_per_s, m.mfu, m.memory_gib, m.data_wait_s, m.comm_wait_s, m.bubble_s,
                           static_cast<double>(m.global_batch), static_cast<double>(m.skipped_steps),
                           static_cast<double>(m.loss_spikes), static_cast<double>(m.straggler_reports)};
  static_assert(std::size(values) == std::size(kStepMetrics), "a value for every figure of the table, in its order");
  std::vector<MetricValue> out;
  for (size_t i = 0; i < std::size(values); i++) out.emplace_back(&kStepMetrics[i], values[i]);
  if (!std::isnan(m.aux_loss)) out.emplace_back(&kMixtureOfExpertsMetrics[0], m.aux_loss);
  if (!m.expert_load.empty()) {
    out.emplace_back(&kMixtureOfExpertsMetrics[1], *std::max_element(m.expert_load.begin(), m.expert_load.end()));
    out.emplace_back(&kMixtureOfExpertsMetrics[2], m.all_to_all_bytes);
    out.emplace_back(&kMixtureOfExpertsMetrics[3], m.tokens_dropped);
    out.emplace_back(&kMixtureOfExpertsMetrics[4], m.tokens_routed);
  }
  for (size_t i = 0; i < m.s3.size() && i < std::size(kS3Metrics); i++) out.emplace_back(&kS3Metrics[i], m.s3[i]);
  for (size_t i = 0; i < m.goodput.size() && i < std::size(kGoodputMetrics); i++)
    out.emplace_back(&kGoodputMetrics[i], m.goodput[i]);
  return out;
}

MetricsLog::~MetricsLog() = default;

void MetricsLog::keep_records_up_to(int step) {
  std::ifstream in(path_);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;  // a line cut by a kill
    if (j.is_object() && j.contains("step") && j["step"].is_number() && j["step"].get<int>() > step) continue;
    kept += line + "\n";
  }
  write_text_atomically(path_, kept);
}

void MetricsLog::rolled_back_to(int step) {
  if (tensorboard_ != nullptr) guarded([&] { tensorboard_->start_again_at(step + 1); });
  if (!jsonl_.is_open()) return;
  jsonl_.close();
  keep_records_up_to(step);
  jsonl_.open(path_, std::ios::app);
}

void MetricsLog::guarded(const std::function<void()>& write) {
  try {
    write();
  } catch (const UsageError& e) {  // a full disk, a lost mount: the run goes on without the files
    std::fprintf(stderr, "trident: warning: %s; TensorBoard is off for the rest of the run\n", e.what());
    tensorboard_.reset();
  }
}

namespace {

// A machine's telemetry as TensorBoard scalars: host/<host>/..., gpu/<host>/<index>/...
void machine_scalars(TensorBoardWriter& tb, const MachineSample& s, int step) {
  const std::string host = "host/" + s.host + "/";
  tb.scalar(host + "cpu-utilization", s.cpu_utilization, step);
  tb.scalar(host + "memory-used-gib", s.memory_used_gib, step);
  for (const GpuSample& g : s.gpus) {
    const std::string gpu = "gpu/" + s.host + "/" + std::to_string(g.index) + "/";
    tb.scalar(gpu + "utilization", g.utilization, step);
    tb.scalar(gpu + "memory-used-mib", g.memory_used_mib, step);
    tb.scalar(gpu + "temperature-c", g.temperature_c, step);
    tb.scalar(gpu + "power-w", g.power_w, step);
    tb.scalar(gpu + "sm-clock-mhz", g.sm_clock_mhz, step);
    tb.scalar(gpu + "xid-errors", static_cast<double>(g.xid_errors), step);
    tb.scalar(gpu + "ecc-uncorrected", static_cast<double>(g.ecc_uncorrected), step);
  }
}

}  // namespace

MetricsLog::MetricsLog(const std::string& run_dir, int resumed_from, const std::string& tensorboard_dir) {
  if (!tensorboard_dir.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir, resumed_from + 1);
  if (run_dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  dir_ = run_dir;
  path_ = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  if (resumed_from > 0) {
    // Keep what was logged up to the checkpoint, then go on appending: one file for the
    // whole run however often it was resumed (a requeue, a signal).
    keep_records_up_to(resumed_from);
    std::ifstream summary((std::filesystem::path(run_dir) / "summary.json").string());
    std::ostringstream text;
    text << summary.rdbuf();
    earlier_summary_ = text.str();
  }
  jsonl_.open(path_, resumed_from > 0 ? std::ios::app : std::ios::trunc);
  require(jsonl_.good(), "cannot write '" + path_ + "' (log.run_dir)");
}

void MetricsLog::log_step(const StepMetrics& m) {
  char aux[96] = "";
  if (!std::isnan(m.aux_loss)) std::snprintf(aux, sizeof aux, " | aux %.4f", m.aux_loss);
  if (m.tokens_dropped > 0)  // a capacity factor's: the (token, expert) pairs no expert took this step
    std::snprintf(aux + std::strlen(aux), sizeof aux - std::strlen(aux), " | dropped %.0f of %.0f (%.0f%%)",
                  m.tokens_dropped, m.tokens_routed, 100.0 * m.tokens_dropped / std::max(m.tokens_routed, 1.0));
  std::printf("step %*d/%d | loss %.4f%s | lr %.2e | norm %.3f | %.0f tok/s | MFU %.1f%% | %.1f ms | mem %.2f GiB | ETA %s\n",
              static_cast<int>(std::to_string(m.total_steps).size()), m.step, m.total_steps, m.loss, aux,
              m.lr, m.grad_norm, m.tokens_per_s, 100.0 * m.mfu, 1000.0 * m.step_time_s, m.memory_gib,
              format_duration(m.eta_s).c_str());
  std::fflush(stdout);
  const std::vector<MetricValue> values = metric_values(m);
  const Timer writing;
  if (tensorboard_ != nullptr) guarded([&] {
      tensorboard_->scalars(values, m.step);
      for (size_t layer = 0; layer < m.expert_load.size(); layer++)
        tensorboard_->scalar("moe/expert-load/layer-" + std::to_string(layer), m.expert_load[layer], m.step);
      // One scalar per expert: side by side, the bars of the experts' loads.
      for (size_t e = 0; e < m.expert_tokens.size(); e++)
        tensorboard_->scalar("moe/expert-tokens/expert-" + std::to_string(e), m.expert_tokens[e], m.step);
      for (size_t layer = 0; layer < m.expert_tokens_per_layer.size(); layer++)
        for (size_t e = 0; e < m.expert_tokens_per_layer[layer].size(); e++)
          tensorboard_->scalar("moe/expert-tokens/layer-" + std::to_string(layer) + "/expert-" + std::to_string(e),
                               m.expert_tokens_per_layer[layer][e], m.step);
      for (const MachineSample& machine : m.machines) machine_scalars(*tensorboard_, machine, m.step);
      tensorboard_->flush();  // a killed run loses at most what came after this line
    });
  if (exporter_ != nullptr) exporter_->set(values);
  writer_seconds_ += writing.seconds();
  if (!jsonl_.is_open()) return;
  nlohmann::json j;
  if (!m.machines.empty()) {
    j["machines"] = nlohmann::json::array();
    for (const MachineSample& machine : m.machines) j["machines"].push_back(to_json(machine));
  }
  for (const auto& [metric, value] : values) j[metric->key] = value;
  j["step"] = m.step;
  j["loss_steps"] = m.loss_steps;
  if (!m.expert_load.empty()) j["expert_load_per_layer"] = m.expert_load;
  if (!m.expert_tokens.empty()) j["expert_tokens"] = m.expert_tokens;
  if (!m.expert_tokens_per_layer.empty()) j["expert_tokens_per_layer"] = m.expert_tokens_per_layer;
  for (const char* count : {"global_batch", "skipped_steps", "loss_spikes", "straggler_reports", "s3_step", "s3_lag_steps",
                            "s3_upload_retries", "tokens_routed", "tokens_dropped"})
    if (j.contains(count)) j[count] = static_cast<int64_t>(j[count].get<double>());
  jsonl_ << j.dump() << "\n";
  jsonl_.flush();
}

void MetricsLog::log_config(const std::string& ini) {
  if (tensorboard_ == nullptr) return;
  // Indented: TensorBoard's text plugin shows Markdown, and a code block keeps the lines.
  std::string markdown;
  size_t at = 0;
  while (at < ini.size()) {
    const size_t end = ini.find('\n', at);
    markdown += "    " + ini.substr(at, end == std::string::npos ? std::string::npos : end - at) + "\n";
    if (end == std::string::npos) break;
    at = end + 1;
  }
  guarded([&] {
    tensorboard_->text("config", markdown, 0);
    tensorboard_->flush();
  });
}

void MetricsLog::log_validation(int step, double val_loss) {
  std::printf("step %d | val loss %.4f | perplexity %.2f\n", step, val_loss, std::exp(val_loss));
  std::fflush(stdout);
  const std::vector<MetricValue> values = {{&kValidationMetrics[0], val_loss},
                                           {&kValidationMetrics[1], std::exp(val_loss)}};
  if (tensorboard_ != nullptr) guarded([&] {
      tensorboard_->scalars(values, step);
      tensorboard_->flush();
    });
  if (exporter_ != nullptr) exporter_->set(values);
  if (!jsonl_.is_open()) return;
  jsonl_ << nlohmann::json{{"step", step}, {"val_loss", val_loss}, {"val_perplexity", std::exp(val_loss)}}.dump() << "\n";
  jsonl_.flush();
}

void MetricsLog::write_summary(const std::string& json_text) const {
  if (dir_.empty()) return;
  // Whole or absent, for whoever collects it (a sweep reads it once the run has ended).
  write_text_atomically((std::filesystem::path(dir_) / "summary.json").string(), json_text + "\n");
}

}  // namespace trident
