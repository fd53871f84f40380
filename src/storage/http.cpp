#include "storage/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>

#include "kernels/base/error.h"
#include "storage/background_priority.h"

namespace trident {

namespace {

struct Exchange {
  const HttpRequest* request;
  HttpResponse* response;
  size_t sent = 0;
};

size_t read_body(char* buffer, size_t size, size_t count, void* user) {
  auto* x = static_cast<Exchange*>(user);
  const std::string_view body = x->request->body;
  const size_t n = std::min(size * count, body.size() - x->sent);
  std::memcpy(buffer, body.data() + x->sent, n);
  x->sent += n;
  return n;
}

size_t write_body(char* data, size_t size, size_t count, void* user) {
  auto* x = static_cast<Exchange*>(user);
  const size_t n = size * count;
  // Only a success's body goes to the caller's sink; an error's is kept to be read.
  if (x->request->on_body && x->response->status / 100 == 2) return x->request->on_body(data, n) ? n : 0;
  x->response->body.append(data, n);
  return n;
}

size_t read_header(char* data, size_t size, size_t count, void* user) {
  auto* x = static_cast<Exchange*>(user);
  const size_t n = size * count;
  std::string line(data, n);
  if (line.starts_with("HTTP/")) {  // a new response (after a 100 Continue): start over
    x->response->headers.clear();
    const size_t space = line.find(' ');
    if (space != std::string::npos) x->response->status = std::strtol(line.c_str() + space + 1, nullptr, 10);
    return n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return n;
  std::string name = line.substr(0, colon), value = line.substr(colon + 1);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  const auto blank = [](unsigned char c) { return std::isspace(c); };
  value.erase(value.begin(), std::find_if_not(value.begin(), value.end(), blank));
  value.erase(std::find_if_not(value.rbegin(), value.rend(), blank).base(), value.end());
  x->response->headers[name] = value;
  return n;
}

int check_cancel(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  keep_background_moving();  // a long transfer at idle priority that is starved gets a share
  const auto* cancel = static_cast<const std::atomic<bool>*>(user);
  return cancel->load() ? 1 : 0;  // non-zero: libcurl aborts the transfer
}

}  // namespace

std::string HttpResponse::header(const std::string& name) const {
  const auto it = headers.find(name);
  return it == headers.end() ? "" : it->second;
}

HttpSession::HttpSession() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
  check(curl_ != nullptr, "curl_easy_init failed");
}

HttpSession::~HttpSession() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

HttpResponse HttpSession::perform(const HttpRequest& request) {
  CURL* curl = static_cast<CURL*>(curl_);
  curl_easy_reset(curl);  // keeps the open connection, forgets the last request's options
  HttpResponse response;
  Exchange exchange{&request, &response};
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for timeouts
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(request.connect_timeout_s * 1000));
  if (request.timeout_s > 0) curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(request.timeout_s * 1000));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, request.stall_bytes_per_s);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, request.stall_s);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, read_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &exchange);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &exchange);
  if (request.cancel != nullptr) {
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, check_cancel);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, const_cast<std::atomic<bool>*>(request.cancel));
  }
  const std::string& m = request.method;
  if (m == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (m == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, read_body);
    curl_easy_setopt(curl, CURLOPT_READDATA, &exchange);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else if (m == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else if (m != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, m.c_str());
  }
  curl_slist* headers = nullptr;
  for (const std::string& h : request.headers) headers = curl_slist_append(headers, h.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (!request.sigv4.empty()) {
    curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, request.sigv4.c_str());
    curl_easy_setopt(curl, CURLOPT_USERNAME, request.access_key.c_str());
    curl_easy_setopt(curl, CURLOPT_PASSWORD, request.secret_key.c_str());
  }
  char error[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    response.transport_error = error[0] != '\0' ? error : curl_easy_strerror(rc);
    response.host_unresolved = rc == CURLE_COULDNT_RESOLVE_HOST;
    response.status = 0;
    return response;
  }
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  response.status = status;
  return response;
}

std::string uri_encode(std::string_view text, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace trident
