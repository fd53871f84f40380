#include "storage/s3_uri.h"

#include <regex>

#include "kernels/base/error.h"

namespace trident {

std::string S3Uri::key(const std::string& name) const { return prefix.empty() ? name : prefix + "/" + name; }

std::string S3Uri::relative(const std::string& key) const {
  if (prefix.empty()) return key;
  if (key.size() <= prefix.size() + 1 || key.compare(0, prefix.size(), prefix) != 0 || key[prefix.size()] != '/')
    return "";
  return key.substr(prefix.size() + 1);
}

std::string S3Uri::str() const { return "s3://" + bucket + (prefix.empty() ? "" : "/" + prefix); }

bool is_s3_uri(const std::string& text) { return text.starts_with("s3://"); }

S3Uri parse_s3_uri(const std::string& text) {
  const std::string what = "'" + text + "' is not an S3 URI: ";
  require(is_s3_uri(text), what + "it should read s3://bucket/prefix");
  const std::string rest = text.substr(5);
  const size_t slash = rest.find('/');
  S3Uri uri;
  uri.bucket = rest.substr(0, slash);
  if (slash != std::string::npos) uri.prefix = rest.substr(slash + 1);
  while (!uri.prefix.empty() && uri.prefix.back() == '/') uri.prefix.pop_back();
  require(!uri.bucket.empty(), what + "no bucket (s3://bucket/prefix)");
  // S3's bucket names: 3-63 characters, lowercase letters, digits, '.' and '-', a letter
  // or digit at either end, no "..", not an IP address.
  static const std::regex bucket_name("[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]");
  static const std::regex ip_address("[0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+");
  require(std::regex_match(uri.bucket, bucket_name) && uri.bucket.find("..") == std::string::npos &&
              !std::regex_match(uri.bucket, ip_address),
          what + "'" + uri.bucket + "' is not a bucket name S3 accepts (3-63 lowercase letters, digits, '.' or '-')");
  require(uri.prefix.empty() || (uri.prefix.front() != '/' && uri.prefix.find("//") == std::string::npos),
          what + "the prefix '" + uri.prefix + "' has an empty path segment ('//')");
  for (const char c : uri.prefix)
    require(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f && c != '\\',
            what + "the prefix holds a control character or '\\'");
  return uri;
}

void check_s3_region(const std::string& region, bool custom) {
  // aws: two letters, an optional partition (gov, iso, isob, isof), a direction, a number.
  static const std::regex aws_region("[a-z]{2}(-gov|-iso[a-z]?)?-(north|south|east|west|central|northeast|northwest|"
                                     "southeast|southwest)-[0-9]{1,2}");
  static const std::regex custom_region("[a-z0-9][a-z0-9-]{0,62}");
  if (custom)
    require(std::regex_match(region, custom_region),
            "checkpoint.s3_region '" + region + "' is not a region name (lowercase letters, digits and '-')");
  else
    require(std::regex_match(region, aws_region),
            "checkpoint.s3_region '" + region + "' is not an AWS region (like us-east-1, eu-central-2, "
            "us-gov-west-1); for another S3-compatible store give its checkpoint.s3_endpoint");
}

}  // namespace trident
