#include "monitor/step_trace.h"

#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace trident::trace {

std::atomic<bool> recording{false};

namespace {

using Clock = std::chrono::steady_clock;
std::atomic<Clock::rep> zero{Clock::now().time_since_epoch().count()};  // read by the checkpoint writer's thread too
std::mutex mutex;
std::vector<std::string> events;  // each one event's JSON text
std::unordered_map<std::thread::id, int> thread_ids;

int thread_id() {  // 0 for the first thread that records (the training loop), then 1, 2, ...
  const auto [it, added] = thread_ids.emplace(std::this_thread::get_id(), static_cast<int>(thread_ids.size()));
  return it->second;
}

std::string quoted(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace

double now_us() {
  const Clock::duration since = Clock::now().time_since_epoch() - Clock::duration(zero.load());
  return std::chrono::duration<double, std::micro>(since).count();
}

void set_zero() { zero = Clock::now().time_since_epoch().count(); }

void start() { recording.store(true); }
void stop() { recording.store(false); }

void complete(const std::string& name, const char* category, double begin_us, const std::string& args) {
  const double end = now_us();
  std::lock_guard<std::mutex> lock(mutex);
  char timing[96];
  std::snprintf(timing, sizeof timing, "\"ts\":%.3f,\"dur\":%.3f", begin_us, end - begin_us);
  events.push_back("{\"name\":" + quoted(name) + ",\"cat\":\"" + category + "\",\"ph\":\"X\"," + timing +
                   ",\"tid\":" + std::to_string(thread_id()) + (args.empty() ? "" : ",\"args\":" + args) + "}");
}

void instant(const std::string& name, const char* category, const std::string& args) {
  const double at = now_us();
  std::lock_guard<std::mutex> lock(mutex);
  char timing[48];
  std::snprintf(timing, sizeof timing, "\"ts\":%.3f", at);
  events.push_back("{\"name\":" + quoted(name) + ",\"cat\":\"" + category + "\",\"ph\":\"i\",\"s\":\"t\"," + timing +
                   ",\"tid\":" + std::to_string(thread_id()) + (args.empty() ? "" : ",\"args\":" + args) + "}");
}

std::string take_events(int rank, const std::string& process) {
  std::lock_guard<std::mutex> lock(mutex);
  const std::string pid = ",\"pid\":" + std::to_string(rank) + "}";
  std::string out = "{\"name\":\"process_name\",\"ph\":\"M\",\"args\":{\"name\":" + quoted(process) + "}" + pid +
                    ",{\"name\":\"process_sort_index\",\"ph\":\"M\",\"args\":{\"sort_index\":" + std::to_string(rank) +
                    "}" + pid;
  for (const std::string& e : events) {
    out += ",";
    out += e.substr(0, e.size() - 1) + pid;  // the rank is the process
  }
  events.clear();
  return out;
}

}  // namespace trident::trace
