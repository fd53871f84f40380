#include "train/goodput.h"

#include <algorithm>
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
  if (j.contains("goodput") && j["goodput"].is_array() && j["goodput"].size() == kGoodputParts)
    beat.goodput.seconds = j["goodput"].get<std::array<double, kGoodputParts>>();
  return beat;
}

void write_heartbeat(const std::string& dir, const Heartbeat& beat) {
  if (dir.empty()) return;
  // Not synced: a process that dies leaves it written; a machine that dies may lose the
  // last few, which only makes the next run count a little of its restart as a longer one.
  const std::string path = heartbeat_path(dir), tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << nlohmann::json{{"step", beat.step},
                          {"unix_time", beat.unix_time},
                          {"complete", beat.complete},
                          {"goodput", beat.goodput.seconds}}
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
  if (failed_at_unix_ >= 0) parts_[GoodputPart::restart] = first_step_unix_ - failed_at_unix_;
  else parts_[GoodputPart::startup] = first_step_unix_ - start_unix_;
}

void GoodputLedger::step(int step, double seconds, double data_seconds) {
  if (step + 1 <= failed_step_) {  // done before the failure: trained again
    parts_[GoodputPart::recomputed] += seconds;
    recomputed_steps_++;
    return;
  }
  parts_[GoodputPart::productive] += seconds - data_seconds;
  parts_[GoodputPart::data_wait] += data_seconds;
}

double GoodputLedger::wall_s() const {
  const double now = unix_seconds();
  return now - (failed_at_unix_ >= 0 && first_step_unix_ >= 0 ? failed_at_unix_ : start_unix_);
}

GoodputParts GoodputLedger::parts() const {
  GoodputParts p = parts_;
  p[GoodputPart::other] = std::max(0.0, wall_s() - p.total());  // this run's rest
  for (int i = 0; i < kGoodputParts; i++) p.seconds[i] += earlier_.seconds[i];
  return p;
}

std::vector<double> GoodputLedger::values() const {
  const GoodputParts p = parts();
  std::vector<double> values = {p.ratio()};
  values.insert(values.end(), p.seconds.begin(), p.seconds.end());
  return values;
}

std::string GoodputLedger::describe() const {
  const GoodputParts p = parts();
  char out[512];
  std::snprintf(out, sizeof out, "goodput %.1f%% of %.1f s: productive %.1f s", 100 * p.ratio(), p.total(),
                p[GoodputPart::productive]);
  std::string s = out;
  for (int i = 1; i < kGoodputParts; i++) {  // after productive
    if (p.seconds[i] <= 0) continue;
    std::string name = kGoodputPartNames[i];
    std::replace(name.begin(), name.end(), '_', ' ');
    std::snprintf(out, sizeof out, ", %s %.2f s", name.c_str(), p.seconds[i]);
    s += out;
  }
  return s;
}

std::string GoodputLedger::restart_line() const {
  if (failed_at_unix_ < 0 || first_step_unix_ < 0) return "";
  char out[256];
  std::snprintf(out, sizeof out,
                "restart after step %d: %.2f s from its last step to this run's first, %d step%s (%.2f s) trained again",
                failed_step_, parts_[GoodputPart::restart], recomputed_steps_, recomputed_steps_ == 1 ? "" : "s",
                parts_[GoodputPart::recomputed]);
  return out;
}

}  // namespace trident
