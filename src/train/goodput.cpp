#include "train/goodput.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/wall_clock.h"

namespace fs = std::filesystem;

namespace trident {

namespace {
std::string heartbeat_path(const std::string& dir) { return (fs::path(dir) / "heartbeat.json").string(); }
}  // namespace

std::optional<Heartbeat> read_heartbeat(const std::string& dir) {
  if (dir.empty()) return std::nullopt;
  std::ifstream in(heartbeat_path(dir));
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j.contains("unix_time")) return std::nullopt;
  Heartbeat beat{j.value("step", 0), j.value("unix_time", 0.0), j.value("complete", false), {}};
  if (j.contains("goodput") && j["goodput"].is_array() && j["goodput"].size() == 8) {
    const std::vector<double> v = j["goodput"].get<std::vector<double>>();
    beat.goodput = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
  }
  return beat;
}

void write_heartbeat(const std::string& dir, const Heartbeat& beat) {
  if (dir.empty()) return;
  // Not synced: a process that dies leaves it written; a machine that dies may lose the
  // last few, which only makes the next run count a little of its restart as a longer one.
  const std::string path = heartbeat_path(dir), tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    const GoodputParts& g = beat.goodput;
    out << nlohmann::json{{"step", beat.step},
                          {"unix_time", beat.unix_time},
                          {"complete", beat.complete},
                          {"goodput", {g.productive, g.recomputed, g.restart, g.startup, g.checkpoint, g.data_wait,
                                       g.evaluation, g.other}}}
               .dump()
        << "\n";
    if (!out) return;  // a full disk: the checkpoint's own save will say so
  }
  std::error_code ignored;
  fs::rename(tmp, path, ignored);
}

GoodputLedger::GoodputLedger(const std::optional<Heartbeat>& previous, int resumed_from, double start_unix)
    : start_unix_(start_unix) {
  // A run that resumes after one that did not finish: what it had done past the checkpoint
  // is lost, and the time since its last step a restart. After a complete run (a longer
  // train.steps), nothing was lost: this one starts up.
  if (!previous || resumed_from == 0 || previous->unix_time > start_unix_) return;  // a job's first run
  earlier_ = previous->goodput;
  if (!previous->complete) {
    failed_at_unix_ = previous->unix_time;
    failed_step_ = previous->step;
  }
}

void GoodputLedger::first_step() {
  if (first_step_unix_ >= 0) return;
  first_step_unix_ = unix_seconds();
  if (failed_at_unix_ >= 0) parts_.restart = first_step_unix_ - failed_at_unix_;
  else parts_.startup = first_step_unix_ - start_unix_;
}

void GoodputLedger::step(int step, double seconds, double data_seconds) {
  if (step + 1 <= failed_step_) {  // done before the failure: trained again
    parts_.recomputed += seconds;
    recomputed_steps_++;
    return;
  }
  parts_.productive += seconds - data_seconds;
  parts_.data_wait += data_seconds;
}

double GoodputLedger::wall_s() const {
  const double now = unix_seconds();
  return now - (failed_at_unix_ >= 0 && first_step_unix_ >= 0 ? failed_at_unix_ : start_unix_);
}

GoodputParts GoodputLedger::parts() const {
  GoodputParts p = parts_;
  p.other = std::max(0.0, wall_s() - p.total());  // this run's rest
  const GoodputParts& e = earlier_;
  return {p.productive + e.productive, p.recomputed + e.recomputed, p.restart + e.restart, p.startup + e.startup,
          p.checkpoint + e.checkpoint, p.data_wait + e.data_wait,   p.evaluation + e.evaluation, p.other + e.other};
}

std::vector<double> GoodputLedger::values() const {
  const GoodputParts p = parts();
  return {p.ratio(),   p.productive, p.recomputed, p.restart,   p.startup,
          p.checkpoint, p.data_wait,  p.evaluation, p.other};
}

std::string GoodputLedger::describe() const {
  const GoodputParts p = parts();
  char out[512];
  std::snprintf(out, sizeof out, "goodput %.1f%% of %.1f s: productive %.1f s", 100 * p.ratio(), p.total(),
                p.productive);
  std::string s = out;
  const std::pair<const char*, double> rest[] = {{"recomputed", p.recomputed}, {"restart", p.restart},
                                                 {"startup", p.startup},       {"checkpoint", p.checkpoint},
                                                 {"data wait", p.data_wait},   {"evaluation", p.evaluation},
                                                 {"other", p.other}};
  for (const auto& [name, seconds] : rest) {
    if (seconds <= 0) continue;
    std::snprintf(out, sizeof out, ", %s %.2f s", name, seconds);
    s += out;
  }
  return s;
}

std::string GoodputLedger::restart_line() const {
  if (failed_at_unix_ < 0 || first_step_unix_ < 0) return "";
  char out[256];
  std::snprintf(out, sizeof out,
                "restart after step %d: %.2f s from its last step to this run's first, %d step%s (%.2f s) trained again",
                failed_step_, parts_.restart, recomputed_steps_, recomputed_steps_ == 1 ? "" : "s", parts_.recomputed);
  return out;
}

}  // namespace trident
