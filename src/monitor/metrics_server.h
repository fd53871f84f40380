// The HTTP side of the Prometheus endpoint: one page, GET /metrics, anything else 404.
// Written here rather than taken from prometheus-cpp's exposer, whose web server
// (civetweb, as Debian builds it) starts its threads with 100 KB stacks: in a CUDA build
// cuBLASLt's thread-local storage alone takes 92 KB of every thread's stack, and those
// threads fail to start. One thread of ours, a normal stack; a client gets 5 s for its whole
// exchange, however it trickles, and a stopping server lets it go at once. prometheus-cpp
// still makes the page (its text serializer).
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace trident {

class MetricsServer {
 public:
  // Listens on every interface at `port` and serves `page()` at /metrics from a thread of
  // its own; UsageError naming the port when it cannot be bound.
  MetricsServer(int port, std::function<std::string()> page);
  MetricsServer(const MetricsServer&) = delete;
  ~MetricsServer();

 private:
  void serve();
  void answer(int client);

  std::function<std::string()> page_;
  int listener_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace trident
