#include "monitor/metrics_server.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/error.h"

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
    const int client = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    // Whatever the client does, the thread is free again within these bounds.
    const timeval bound{5, 0};
    setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
    setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof bound);
    answer(client);
    close(client);
  }
}

void MetricsServer::answer(int client) {
  std::string request;
  char buffer[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 16384) {
    const ssize_t n = recv(client, buffer, sizeof buffer, 0);
    if (n <= 0) return;  // closed, or silent past the bound
    request.append(buffer, static_cast<size_t>(n));
  }
  const size_t line_end = request.find("\r\n");
  const std::string line = request.substr(0, line_end);
  const bool metrics = line.rfind("GET /metrics ", 0) == 0 || line.rfind("GET /metrics? ", 0) == 0 ||
                       line.rfind("GET /metrics?", 0) == 0;
  const std::string body = metrics ? page_() : "not found: this port serves /metrics only\n";
  const std::string head = std::string(metrics ? "HTTP/1.1 200 OK\r\n" : "HTTP/1.1 404 Not Found\r\n") +
                           (metrics ? "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                                    : "Content-Type: text/plain; charset=utf-8\r\n") +
                           "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  const std::string response = head + body;
  size_t sent = 0;
  while (sent < response.size()) {
    const ssize_t n = send(client, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;  // gone, or not reading past the bound
    sent += static_cast<size_t>(n);
  }
}

}  // namespace trident
