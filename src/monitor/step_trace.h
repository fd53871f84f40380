// A timeline of chosen steps (log.trace_steps = A:B), as Chrome's trace-event JSON that
// Perfetto and chrome://tracing open: per rank (a "process"), the step, its data, each
// micro-batch's forward and backward and each layer's in them, every collective and
// pipeline transfer (the time this rank waited for it, with the group and the bytes),
// the optimizer, checkpoint writes. Ranks' clocks are aligned at a barrier, so the
// bubble, the exposed communication and a straggler show as they happened.
//
// Recording is process-wide (the layers, communicators and the checkpoint writer add to
// it without being handed anything) and costs one relaxed atomic load when off.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <type_traits>

namespace trident::trace {

extern std::atomic<bool> recording;

// Microseconds since the ranks' common zero (set_zero()).
double now_us();
// The ranks' common zero: call right after a barrier, on every rank.
void set_zero();
void start();
void stop();
// A finished interval [begin_us, now) on this thread: name, category, args as a JSON
// object's text ("" for none).
void complete(const std::string& name, const char* category, double begin_us, const std::string& args = "");
// A moment.
void instant(const std::string& name, const char* category, const std::string& args = "");
// This rank's events as a JSON array's elements (comma-separated), then cleared; with
// `process` naming the rank in the viewer.
std::string take_events(int rank, const std::string& process);

// An interval from construction to destruction (when recording).
class Span {
 public:
  Span(const char* name, const char* category) : on_(recording.load(std::memory_order_relaxed)) {
    if (on_) name_ = name, category_ = category, begin_ = now_us();
  }
  Span(std::string name, const char* category) : on_(recording.load(std::memory_order_relaxed)) {
    if (on_) name_ = std::move(name), category_ = category, begin_ = now_us();
  }
  // The name made only when recording (what runs per layer costs nothing otherwise).
  template <class MakeName, class = std::enable_if_t<std::is_invocable_r_v<std::string, MakeName>>>
  Span(const char* category, MakeName&& make_name) : on_(recording.load(std::memory_order_relaxed)) {
    if (on_) name_ = make_name(), category_ = category, begin_ = now_us();
  }
  Span(const Span&) = delete;
  ~Span() {
    if (on_) complete(name_, category_, begin_, args_);
  }
  void args(std::string json_object) { args_ = std::move(json_object); }

 private:
  bool on_;
  std::string name_, args_;
  const char* category_ = "";
  double begin_ = 0;
};

inline bool on() { return recording.load(std::memory_order_relaxed); }

}  // namespace trident::trace
