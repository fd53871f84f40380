#include "storage/s3_endpoint.h"

#include <cstdlib>

#include "kernels/base/error.h"
#include "storage/aws_credentials.h"

namespace trident {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

}  // namespace

S3Endpoint resolve_s3_endpoint(const std::string& configured, const std::string& key) {
  S3Endpoint e{configured, key};
  const auto is_true = [](const std::string& v) { return v == "true" || v == "TRUE" || v == "True"; };
  // The variable, else the profile's ignore_configured_endpoint_urls: both the variables
  // and the profile's endpoint_url are then ignored.
  const std::string ignore = env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS");
  const bool ignored = ignore.empty() ? is_true(aws_profile_setting("ignore_configured_endpoint_urls")) : is_true(ignore);
  for (const char* name : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"})
    if (e.url.empty() && !ignored && !env(name).empty()) e = {env(name), name};
  if (e.url.empty() && !ignored) {
    std::string where;
    if (const std::string url = aws_profile_setting("endpoint_url", &where); !url.empty())
      e = {url, "endpoint_url of " + where};
  }
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
