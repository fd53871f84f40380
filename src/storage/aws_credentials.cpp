#include "storage/aws_credentials.h"

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "storage/http.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

std::string home_file(const char* override_variable, const char* relative) {
  if (const std::string path = env(override_variable); !path.empty()) return path;
  const std::string home = env("HOME");
  return home.empty() ? "" : home + "/" + relative;
}

std::string profile() {
  const std::string p = env("AWS_PROFILE");
  return p.empty() ? "default" : p;
}

// An INI file's `section.key` values (AWS's credentials and config files), read as AWS's
// tools read them: `key = value` or `key: value`, `#` and `;` comments. An error names
// the line's number, never its text (it may hold a secret).
std::map<std::string, std::string> read_ini(const std::string& path) {
  std::map<std::string, std::string> values;
  std::ifstream in(path);
  if (!in) return values;
  const auto trim = [](std::string t) {
    const size_t a = t.find_first_not_of(" \t\r"), b = t.find_last_not_of(" \t\r");
    return a == std::string::npos ? std::string() : t.substr(a, b - a + 1);
  };
  std::string section, line;
  for (int number = 1; std::getline(in, line); number++) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line[0] == '[') {
      if (line.back() != ']')
        throw UsageError(path + ": line " + std::to_string(number) + " opens a [section] it does not close");
      section = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const size_t split = line.find_first_of("=:");
    if (split == std::string::npos)
      throw UsageError(path + ": line " + std::to_string(number) + " is not `key = value`");
    const std::string key = trim(line.substr(0, split)), value = trim(line.substr(split + 1));
    if (!value.empty()) values[section + "." + key] = value;
  }
  return values;
}

// ---- IMDSv2 ----

std::string imds_endpoint() {
  std::string e = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (e.empty()) e = "http://169.254.169.254";
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e;
}

bool imds_disabled() { return env("AWS_EC2_METADATA_DISABLED") == "true"; }

// One answer of the metadata service (a session token first, as IMDSv2 requires);
// nullopt off EC2 (nothing answers within a second).
std::optional<std::string> imds_get(HttpSession& http, const std::string& path) {
  HttpRequest token;
  token.method = "PUT";
  token.url = imds_endpoint() + "/latest/api/token";
  token.headers = {"X-aws-ec2-metadata-token-ttl-seconds: 21600"};
  token.connect_timeout_s = 1;
  token.timeout_s = 2;
  const HttpResponse t = http.perform(token);
  if (t.status != 200) return std::nullopt;
  HttpRequest get;
  get.url = imds_endpoint() + path;
  get.headers = {"X-aws-ec2-metadata-token: " + t.body};
  get.connect_timeout_s = 1;
  get.timeout_s = 2;
  const HttpResponse r = http.perform(get);
  if (r.status != 200) return std::nullopt;
  return r.body;
}

std::chrono::system_clock::time_point parse_expiration(const std::string& text) {
  std::tm tm{};
  if (strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return {};
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

std::optional<AwsCredentials> from_instance_role() {
  if (imds_disabled()) return std::nullopt;
  HttpSession http;
  const std::optional<std::string> roles = imds_get(http, "/latest/meta-data/iam/security-credentials/");
  if (!roles || roles->empty()) return std::nullopt;
  const std::string role = roles->substr(0, roles->find('\n'));
  const std::optional<std::string> text = imds_get(http, "/latest/meta-data/iam/security-credentials/" + role);
  if (!text) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("Code", "") != "Success") return std::nullopt;
  AwsCredentials c;
  c.access_key = j.value("AccessKeyId", "");
  c.secret_key = j.value("SecretAccessKey", "");
  c.session_token = j.value("Token", "");
  c.expires = parse_expiration(j.value("Expiration", ""));
  c.source = "instance role " + role + " (metadata service)";
  if (c.access_key.empty() || c.secret_key.empty()) return std::nullopt;
  return c;
}

AwsCredentials resolve() {
  AwsCredentials c;
  c.access_key = env("AWS_ACCESS_KEY_ID");
  c.secret_key = env("AWS_SECRET_ACCESS_KEY");
  if (!c.access_key.empty() || !c.secret_key.empty()) {
    require(!c.access_key.empty() && !c.secret_key.empty(),
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together");
    c.session_token = env("AWS_SESSION_TOKEN");
    c.source = "environment";
    return c;
  }
  const std::string file = home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
  const auto values = read_ini(file);
  const std::string p = profile();
  const auto value = [&](const char* key) {
    const auto it = values.find(p + "." + key);
    return it == values.end() ? std::string() : it->second;
  };
  if (!value("aws_access_key_id").empty()) {
    c.access_key = value("aws_access_key_id");
    c.secret_key = value("aws_secret_access_key");
    c.session_token = value("aws_session_token");
    require(!c.secret_key.empty(), file + ": profile [" + p + "] has aws_access_key_id but no aws_secret_access_key");
    c.source = "credentials file " + file + " [" + p + "]";
    return c;
  }
  // A profile asked for by name must exist (as AWS's tools say), not fall through.
  require(env("AWS_PROFILE").empty(), "AWS_PROFILE=" + p + ": " + file + " has no profile [" + p +
                                          "] with aws_access_key_id");
  if (std::optional<AwsCredentials> role = from_instance_role()) return *role;
  throw UsageError("no AWS credentials for S3: looked at AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, " +
                   (file.empty() ? std::string("~/.aws/credentials") : file) + " (profile [" + p +
                   "]) and the EC2 instance metadata service" + (imds_disabled() ? " (disabled)" : ""));
}

}  // namespace

AwsCredentialProvider::AwsCredentialProvider() : current_(resolve()) {}

AwsCredentials AwsCredentialProvider::get() {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::system_clock::now();
  if (current_.expires.time_since_epoch().count() != 0 && now + std::chrono::minutes(5) >= current_.expires) {
    if (std::optional<AwsCredentials> fresh = from_instance_role()) current_ = *fresh;
  }
  return current_;
}

std::string AwsCredentialProvider::describe() {
  const std::lock_guard<std::mutex> lock(mutex_);
  return current_.source + (current_.session_token.empty() ? "" : ", with a session token");
}

std::string default_aws_region() {
  for (const char* name : {"AWS_REGION", "AWS_DEFAULT_REGION"})
    if (const std::string r = env(name); !r.empty()) return r;
  if (const std::string r = aws_profile_setting("region"); !r.empty()) return r;
  if (imds_disabled()) return "";
  HttpSession http;
  return imds_get(http, "/latest/meta-data/placement/region").value_or("");
}

std::string aws_profile_setting(const std::string& key, std::string* where) {
  const std::string file = home_file("AWS_CONFIG_FILE", ".aws/config");
  const auto values = read_ini(file);
  const std::string p = profile();
  for (const std::string& section : {p == "default" ? p : "profile " + p, p}) {
    const auto it = values.find(section + "." + key);
    if (it == values.end()) continue;
    if (where != nullptr) *where = "profile [" + section + "] of " + file;
    return it->second;
  }
  return "";
}

}  // namespace trident
