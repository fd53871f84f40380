// Where a checkpoint's second tier lives: an `s3://bucket/prefix` URI, checked as S3
// names buckets, and the keys of the objects under it.
#pragma once

#include <string>

namespace trident {

struct S3Uri {
  std::string bucket;
  std::string prefix;  // no leading or trailing '/'; may be empty

  // The key of `name` under the prefix ("runs/a" + "latest" -> "runs/a/latest").
  std::string key(const std::string& name) const;
  // The key relative to the prefix ("runs/a/step_1/x" -> "step_1/x"); "" if outside it.
  std::string relative(const std::string& key) const;
  std::string str() const;  // s3://bucket/prefix
};

bool is_s3_uri(const std::string& text);
// UsageError saying what is wrong with a malformed URI (no bucket, a bucket name S3
// refuses, "//" in the prefix, another scheme).
S3Uri parse_s3_uri(const std::string& text);
// UsageError unless `region` is an AWS region's name (us-east-1, eu-central-2,
// us-gov-west-1, cn-north-1, ...); with a custom endpoint (custom true) any lowercase
// name of letters, digits and '-' (RGW's zonegroups, MinIO's "us-east-1").
void check_s3_region(const std::string& region, bool custom);

}  // namespace trident
