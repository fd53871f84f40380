// HTTP requests through libcurl, for S3 and the EC2 instance metadata service. One
// HttpSession per thread keeps its connection open between requests. SigV4 signing is
// libcurl's (CURLOPT_AWS_SIGV4), over the method, path, query and every header given.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace trident {

struct HttpRequest {
  std::string method = "GET";  // GET, HEAD, PUT, POST, DELETE
  std::string url;             // path and query already encoded (S3's canonical form)
  std::vector<std::string> headers;  // "Name: value"
  std::string_view body;             // PUT and POST
  // SigV4: "aws:amz:<region>:s3" with the access key and secret; empty: unsigned.
  std::string sigv4, access_key, secret_key;
  double connect_timeout_s = 10;
  double timeout_s = 0;  // the whole exchange; 0: none (then only the stall limit)
  // A transfer slower than stall_bytes_per_s for stall_s is given up (a hung server).
  long stall_bytes_per_s = 1024, stall_s = 30;
  // Set (by another thread) to abandon the exchange at once.
  const std::atomic<bool>* cancel = nullptr;
  // Where the body goes (default: HttpResponse::body); return false to abort.
  std::function<bool(const char* data, size_t size)> on_body;
};

struct HttpResponse {
  long status = 0;                             // 0: no response (transport_error says why)
  std::string transport_error;                 // libcurl's message when the exchange failed
  bool host_unresolved = false;                // the failure: the URL's host name did not resolve (DNS)
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;
  std::string header(const std::string& lowercase_name) const;
};

class HttpSession {
 public:
  HttpSession();
  ~HttpSession();
  HttpSession(const HttpSession&) = delete;
  HttpSession& operator=(const HttpSession&) = delete;
  HttpResponse perform(const HttpRequest& request);

 private:
  void* curl_;  // CURL*
};

// RFC 3986 percent-encoding of everything but A-Z a-z 0-9 - . _ ~ (and '/' when
// keep_slash): SigV4's canonical encoding.
std::string uri_encode(std::string_view text, bool keep_slash);

}  // namespace trident
