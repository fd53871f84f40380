#include "train/metrics_log.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/durable_file.h"
#include "runtime/error.h"

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

MetricsLog::MetricsLog(const std::string& run_dir, int resumed_from) {
  if (run_dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  dir_ = run_dir;
  path_ = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  if (resumed_from > 0) {
    // Keep what was logged up to the checkpoint, then go on appending: one file for the
    // whole run however often it was resumed (a requeue, a signal).
    std::ifstream in(path_);
    std::string kept;
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) continue;  // a line cut by a kill
      if (j.is_object() && j.contains("step") && j["step"].is_number() && j["step"].get<int>() > resumed_from) continue;
      kept += line + "\n";
    }
    write_text_atomically(path_, kept);
    std::ifstream summary((std::filesystem::path(run_dir) / "summary.json").string());
    std::ostringstream text;
    text << summary.rdbuf();
    earlier_summary_ = text.str();
  }
  jsonl_.open(path_, resumed_from > 0 ? std::ios::app : std::ios::trunc);
  require(jsonl_.good(), "cannot write '" + path_ + "' (log.run_dir)");
}

void MetricsLog::log_step(const StepMetrics& m) {
  std::printf("step %*d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | MFU %.1f%% | %.1f ms | mem %.2f GiB | ETA %s\n",
              static_cast<int>(std::to_string(m.total_steps).size()), m.step, m.total_steps, m.loss,
              m.lr, m.grad_norm, m.tokens_per_s, 100.0 * m.mfu, 1000.0 * m.step_time_s, m.memory_gib,
              format_duration(m.eta_s).c_str());
  std::fflush(stdout);
  if (!jsonl_.is_open()) return;
  nlohmann::json j = {{"step", m.step},          {"loss", m.loss},
                      {"loss_step", m.loss_step}, {"loss_steps", m.loss_steps},
                      {"lr", m.lr},              {"grad_norm", m.grad_norm},
                      {"tokens_per_s", m.tokens_per_s}, {"mfu", m.mfu},
                      {"step_time_s", m.step_time_s},   {"memory_gib", m.memory_gib},
                      {"comm_wait_s", m.comm_wait_s}};
  jsonl_ << j.dump() << "\n";
  jsonl_.flush();
}

void MetricsLog::log_validation(int step, double val_loss) {
  std::printf("step %d | val loss %.4f | perplexity %.2f\n", step, val_loss, std::exp(val_loss));
  std::fflush(stdout);
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
