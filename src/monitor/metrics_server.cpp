#include "monitor/metrics_server.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "kernels/base/error.h"

namespace trident {

MetricsServer::MetricsServer(int port, std::function<std::string()> page) : page_(std::move(page)) {
  require(port > 0 && port < 65536, "log.metrics_port must be a TCP port, 1-65535 (0: off), got " + std::to_string(port));
  listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  require(listener_ >= 0, std::string("log.metrics_port: no socket: ") + std::strerror(errno));
  const int yes = 1;
  setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);  // a restarted run gets its port back at once
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || listen(listener_, 16) != 0) {
    const std::string why = std::strerror(errno);
    close(listener_);
    throw UsageError("log.metrics_port " + std::to_string(port) + " cannot be served: " + why +
                     " (another process has it? choose another port)");
  }
  thread_ = std::thread([this] { serve(); });
}

MetricsServer::~MetricsServer() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  close(listener_);
}

void MetricsServer::serve() {
  while (!stopping_) {
    pollfd p{listener_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;  // a look at stopping_ five times a second
    const int client = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (client < 0) {  // out of descriptors, say: wait rather than spin on a readable listener
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    answer(client);
    close(client);
  }
}

namespace {

// Waits until `client` can be read (or written), within the connection's deadline and
// while the server runs; false when it cannot.
bool ready(int client, short events, std::chrono::steady_clock::time_point deadline, const std::atomic<bool>& stopping) {
  while (!stopping) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{client, events, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 200)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
  return false;
}

}  // namespace

void MetricsServer::answer(int client) {
  // One deadline for the whole exchange, however the client trickles: the thread is free
  // again within 5 s whatever it does.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::string request;
  char buffer[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.find("\n\n") == std::string::npos &&
         request.size() < 16384) {
    if (!ready(client, POLLIN, deadline, stopping_)) return;
    const ssize_t n = recv(client, buffer, sizeof buffer, 0);
    if (n == 0) return;  // closed
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return;
    }
    request.append(buffer, static_cast<size_t>(n));
  }
  const std::string line = request.substr(0, request.find_first_of("\r\n"));
  const bool metrics = line.rfind("GET /metrics ", 0) == 0 || line.rfind("GET /metrics?", 0) == 0;
  const std::string body = metrics ? page_() : "not found: this port serves /metrics only\n";
  const std::string head = std::string(metrics ? "HTTP/1.1 200 OK\r\n" : "HTTP/1.1 404 Not Found\r\n") +
                           (metrics ? "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                                    : "Content-Type: text/plain; charset=utf-8\r\n") +
                           "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  const std::string response = head + body;
  size_t sent = 0;
  while (sent < response.size()) {
    if (!ready(client, POLLOUT, deadline, stopping_)) return;
    const ssize_t n = send(client, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return;
    }
    sent += static_cast<size_t>(n);
  }
  shutdown(client, SHUT_WR);  // all of it sent before the close
}

}  // namespace trident
