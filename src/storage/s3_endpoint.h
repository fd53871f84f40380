// Which S3 store a request goes to, as AWS's SDKs and CLI decide it: a key of the config
// first, then AWS_ENDPOINT_URL_S3 (the service's own), then AWS_ENDPOINT_URL (every
// service's), then the profile's endpoint_url in ~/.aws/config (AWS_CONFIG_FILE), else AWS
// S3 itself (https://<bucket>.s3.<region>.amazonaws.com). AWS_IGNORE_CONFIGURED_ENDPOINT_URLS
// (or the profile's ignore_configured_endpoint_urls) = true ignores all but the key, as there.
// (The profile's `services` sections are not read.)
#pragma once

#include <string>

namespace trident {

struct S3Endpoint {
  std::string url;   // http(s)://host[:port]; empty: AWS S3
  std::string from;  // what set it, for messages: the key, the variable, or "" (AWS)
};

// `configured` (the value of the config key `key`) or the environment's; UsageError for a
// value that is not an http:// or https:// URL, naming where it came from.
S3Endpoint resolve_s3_endpoint(const std::string& configured, const std::string& key);

// The host of an http(s) URL ("http://a.b:9000/x" -> "a.b").
std::string url_host(const std::string& url);

}  // namespace trident
