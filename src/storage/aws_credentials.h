// AWS credentials, found where AWS's own tools look, in their order:
//   1. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN)
//   2. the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials),
//      profile AWS_PROFILE (else "default")
//   3. on EC2, the instance's role through the instance metadata service, IMDSv2 (a
//      session token first; AWS_EC2_METADATA_SERVICE_ENDPOINT, AWS_EC2_METADATA_DISABLED),
//      what ParallelCluster's nodes use; these expire and are fetched again before then.
// The secret and the session token never leave this object but to sign a request:
// describe() names the source alone.
#pragma once

#include <chrono>
#include <mutex>
#include <string>

namespace trident {

struct AwsCredentials {
  std::string access_key, secret_key, session_token;
  std::string source;  // "environment", "credentials file ~/.aws/credentials [default]", "instance role NAME"
  std::chrono::system_clock::time_point expires{};  // epoch: never
};

class AwsCredentialProvider {
 public:
  // Resolves the credentials now: UsageError saying where it looked if there are none.
  AwsCredentialProvider();
  // The current credentials (thread-safe), fetched again from the instance metadata
  // service five minutes before they expire.
  AwsCredentials get();
  std::string describe();

 private:
  std::mutex mutex_;
  AwsCredentials current_;
};

// The region AWS's tools would use: AWS_REGION, AWS_DEFAULT_REGION, the profile's
// `region` in the config file (AWS_CONFIG_FILE, else ~/.aws/config), the instance's
// region from the metadata service; "" if none says.
std::string default_aws_region();

// A setting of the profile (AWS_PROFILE, else "default") in the config file (AWS_CONFIG_FILE,
// else ~/.aws/config): `region`, `endpoint_url`, ...; "" where the file does not set it.
// `where` (when given) is told "profile [p] of FILE" for messages.
std::string aws_profile_setting(const std::string& key, std::string* where = nullptr);

}  // namespace trident
