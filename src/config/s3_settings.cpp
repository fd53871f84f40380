#include "config/s3_settings.h"

#include "storage/aws_credentials.h"
#include "storage/s3_uri.h"

namespace trident {

S3Settings s3_settings(const CheckpointConfig& c) {
  return s3_settings(c, resolve_s3_endpoint(c.s3_endpoint, "checkpoint.s3_endpoint"));
}

S3Settings s3_settings(const CheckpointConfig& c, const S3Endpoint& endpoint) {
  S3Settings s;
  s.endpoint = endpoint.url;
  s.endpoint_from = endpoint.from;
  s.region = c.s3_region.empty() ? default_aws_region() : c.s3_region;
  if (s.region.empty()) s.region = "us-east-1";
  check_s3_region(s.region, !s.endpoint.empty());
  s.part_bytes = static_cast<size_t>(c.s3_part_mb) << 20;
  s.parallel = c.s3_parallel;
  s.retry_s = c.s3_retry_s;
  return s;
}

}  // namespace trident
