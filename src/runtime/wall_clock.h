// The wall clock, for what other processes and people read: times in files, logs and
// metrics (durations within a process: runtime/timer.h, on the monotonic clock).
#pragma once

#include <chrono>
#include <ctime>
#include <string>

namespace trident {

// Seconds since the Unix epoch, with their fraction.
inline double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// "2026-12-03T01:54:31Z": a Unix time in UTC, to the second.
inline std::string utc_text(double unix_time) {
  const std::time_t t = static_cast<std::time_t>(unix_time);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return text;
}

}  // namespace trident
