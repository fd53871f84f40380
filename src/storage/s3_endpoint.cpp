#include "storage/s3_endpoint.h"

#include <cstdlib>

#include "kernels/base/error.h"

namespace trident {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

}  // namespace

S3Endpoint resolve_s3_endpoint(const std::string& configured, const std::string& key) {
  S3Endpoint e{configured, key};
  const std::string ignore = env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS");
  const bool environment_ignored = ignore == "true" || ignore == "TRUE" || ignore == "True";
  for (const char* name : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"})
    if (e.url.empty() && !environment_ignored && !env(name).empty()) e = {env(name), name};
  if (e.url.empty()) return {"", ""};
  require(e.url.starts_with("http://") || e.url.starts_with("https://"),
          e.from + " must be an http:// or https:// URL (an S3-compatible store's), got '" + e.url + "'");
  return e;
}

std::string url_host(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t start = scheme == std::string::npos ? 0 : scheme + 3;
  std::string authority = url.substr(start, url.find_first_of("/?#", start) - start);
  if (const size_t at = authority.rfind('@'); at != std::string::npos) authority = authority.substr(at + 1);
  if (authority.starts_with("[")) return authority.substr(0, authority.find(']') + 1);  // an IPv6 address
  return authority.substr(0, authority.find(':'));
}

}  // namespace trident
