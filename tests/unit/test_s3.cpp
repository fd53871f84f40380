// The S3 client: URIs and regions as arithmetic; credentials as AWS's tools find them;
// and every request against a real S3 server (Ceph's RADOS Gateway, started by
// tests/s3/test_s3.sh, which verifies SigV4 signatures), through a proxy that answers
// 503 Slow Down on request. The S3Store tests need that server: TRIDENT_TEST_S3_ENDPOINT.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <netdb.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>
#include <thread>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <zlib.h>

#include "cli_helpers.h"
#include "runtime/exit_codes.h"
#include "storage/aws_credentials.h"
#include "storage/background_priority.h"
#include "storage/file_md5.h"
#include "storage/s3_client.h"
#include "storage/s3_endpoint.h"
#include "storage/s3_uri.h"

namespace fs = std::filesystem;

namespace trident {
namespace {

// Sets environment variables for one scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> values) {
    for (const auto& [name, value] : values) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old == nullptr ? std::optional<std::string>() : std::string(old));
      if (value == nullptr) unsetenv(name);
      else setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) setenv(name.c_str(), value->c_str(), 1);
      else unsetenv(name.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(S3Uri, ParsesBucketAndPrefix) {
  const S3Uri a = parse_s3_uri("s3://my-bucket/runs/llama7b/");
  EXPECT_EQ(a.bucket, "my-bucket");
  EXPECT_EQ(a.prefix, "runs/llama7b");
  EXPECT_EQ(a.key("latest"), "runs/llama7b/latest");
  EXPECT_EQ(a.relative("runs/llama7b/step_00000010/manifest.json"), "step_00000010/manifest.json");
  EXPECT_EQ(a.relative("runs/llama7bb/latest"), "");
  EXPECT_EQ(a.str(), "s3://my-bucket/runs/llama7b");
  const S3Uri b = parse_s3_uri("s3://bucket.with.dots");
  EXPECT_EQ(b.prefix, "");
  EXPECT_EQ(b.key("latest"), "latest");
}

TEST(S3Uri, RefusesWhatS3Would) {
  for (const char* bad : {"my-bucket/runs", "s3:/bucket", "s3://", "s3:///prefix", "s3://My_Bucket/x", "s3://ab",
                          "s3://-bucket", "s3://bucket-", "s3://a..b", "s3://192.168.1.1/x", "s3://bucket//x",
                          "gs://bucket/x"}) {
    EXPECT_THROW(parse_s3_uri(bad), UsageError) << bad;
  }
}

TEST(S3Uri, RegionsAsAwsNamesThem) {
  for (const char* good : {"us-east-1", "eu-central-2", "ap-southeast-4", "us-gov-west-1", "cn-north-1", "il-central-1"})
    EXPECT_NO_THROW(check_s3_region(good, false)) << good;
  for (const char* bad : {"us-east", "US-EAST-1", "useast1", "us_east_1", "", "eu-middle-1", "us-east-1a"})
    EXPECT_THROW(check_s3_region(bad, false), UsageError) << bad;
  EXPECT_NO_THROW(check_s3_region("default", true));  // RGW's zonegroup
  EXPECT_THROW(check_s3_region("Bad Region", true), UsageError);
}

TEST(S3Parts, GrownToFitTenThousand) {
  S3Settings s;
  s.part_bytes = size_t{8} << 20;
  const S3Client client("b", s, nullptr);
  EXPECT_EQ(client.part_bytes_for(uint64_t{1} << 30), size_t{8} << 20);
  // 1 TB in 8 MiB parts would be 119,210 parts: grown to a whole MiB that fits.
  const uint64_t tb = 1000ull * 1000 * 1000 * 1000;
  const size_t part = client.part_bytes_for(tb);
  EXPECT_LE((tb + part - 1) / part, 10000u);
  EXPECT_GT((tb + part - 1) / (part - (1 << 20)), 10000u);  // and no larger than that
  EXPECT_EQ(part % (1 << 20), 0u);
}

TEST(AwsCredentials, EnvironmentFirst) {
  const ScopedEnv env({{"AWS_ACCESS_KEY_ID", "AKIDENV"}, {"AWS_SECRET_ACCESS_KEY", "secret-env"},
                       {"AWS_SESSION_TOKEN", "token-env"}, {"AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"},
                       {"AWS_EC2_METADATA_DISABLED", "true"}});
  AwsCredentialProvider p;
  const AwsCredentials c = p.get();
  EXPECT_EQ(c.access_key, "AKIDENV");
  EXPECT_EQ(c.secret_key, "secret-env");
  EXPECT_EQ(c.session_token, "token-env");
  EXPECT_EQ(p.describe(), "environment, with a session token");  // names the source, never the secret
}

TEST(AwsCredentials, SharedFileAndProfile) {
  const std::string file = testing::TempDir() + "aws_credentials";
  std::ofstream(file) << "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s-default\n\n"
                         "[training]\naws_access_key_id=AKIDTRAIN\naws_secret_access_key=s-train\n"
                         "aws_session_token = tok\n";
  {
    const ScopedEnv env({{"AWS_ACCESS_KEY_ID", nullptr}, {"AWS_SECRET_ACCESS_KEY", nullptr},
                         {"AWS_SHARED_CREDENTIALS_FILE", file.c_str()}, {"AWS_PROFILE", nullptr},
                         {"AWS_EC2_METADATA_DISABLED", "true"}});
    AwsCredentialProvider p;
    EXPECT_EQ(p.get().access_key, "AKIDDEFAULT");
    EXPECT_EQ(p.get().secret_key, "s-default");
    EXPECT_EQ(p.describe(), "credentials file " + file + " [default]");
  }
  {
    const ScopedEnv env({{"AWS_ACCESS_KEY_ID", nullptr}, {"AWS_SECRET_ACCESS_KEY", nullptr},
                         {"AWS_SHARED_CREDENTIALS_FILE", file.c_str()}, {"AWS_PROFILE", "training"},
                         {"AWS_EC2_METADATA_DISABLED", "true"}});
    AwsCredentialProvider p;
    EXPECT_EQ(p.get().access_key, "AKIDTRAIN");
    EXPECT_EQ(p.get().session_token, "tok");
  }
  {
    const ScopedEnv env({{"AWS_ACCESS_KEY_ID", nullptr}, {"AWS_SECRET_ACCESS_KEY", nullptr},
                         {"AWS_SHARED_CREDENTIALS_FILE", file.c_str()}, {"AWS_PROFILE", "nosuch"},
                         {"AWS_EC2_METADATA_DISABLED", "true"}});
    try {
      AwsCredentialProvider p;
      ADD_FAILURE() << "a missing profile was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("no profile [nosuch]"), std::string::npos) << e.what();
    }
  }
}

// `key: value` and `;` comments, as AWS's tools (Python's configparser) read them; a
// line that is neither names its number, never its text (it may hold the secret).
TEST(AwsCredentials, FileSyntaxAsAwsToolsReadIt) {
  const std::string file = testing::TempDir() + "aws_credentials_colon";
  std::ofstream(file) << "; a comment\n[default]\naws_access_key_id: AKIDCOLON\naws_secret_access_key : s-colon\n";
  const ScopedEnv env({{"AWS_ACCESS_KEY_ID", nullptr}, {"AWS_SECRET_ACCESS_KEY", nullptr},
                       {"AWS_SHARED_CREDENTIALS_FILE", file.c_str()}, {"AWS_PROFILE", nullptr},
                       {"AWS_EC2_METADATA_DISABLED", "true"}});
  {
    AwsCredentialProvider p;
    EXPECT_EQ(p.get().access_key, "AKIDCOLON");
    EXPECT_EQ(p.get().secret_key, "s-colon");
  }
  std::ofstream(file) << "[default]\naws_access_key_id = AKID\nwJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n";
  try {
    AwsCredentialProvider p;
    ADD_FAILURE() << "a malformed credentials file was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3 is not `key = value`"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("wJalr"), std::string::npos) << "the secret in a message: " << e.what();
  }
}

// Upload threads run at idle priority, and so do the part threads they start.
TEST(BackgroundPriority, IdleAndInherited) {
  int outer = -1, inner = -1;
  std::thread([&] {
    run_in_background();
    keep_background_moving();  // well before kStarvedAfterSeconds: still idle
    sched_param p{};
    pthread_getschedparam(pthread_self(), &outer, &p);
    std::thread([&] { pthread_getschedparam(pthread_self(), &inner, &p); }).join();
  }).join();
  EXPECT_EQ(outer, SCHED_IDLE);
  EXPECT_EQ(inner, SCHED_IDLE);
  int here = -1;
  sched_param p{};
  pthread_getschedparam(pthread_self(), &here, &p);
  EXPECT_EQ(here, SCHED_OTHER) << "the caller's own priority changed";
}

// A copy's MD5 (what an ETag holds) as coreutils' md5sum gives it, over several of its 8 MiB
// blocks and a part of one; a copy cancelled meanwhile stops within a block: asked before
// each, `stop` ends it at the third, with the error the copy reports.
TEST(FileMd5, IsMd5sumsAndStopsWhenCancelled) {
  const std::string path = testing::TempDir() + "md5_input.bin";
  {
    std::mt19937_64 rng(3);
    std::vector<uint64_t> words(((size_t{8} << 20) * 3 + 12345) / 8);
    for (uint64_t& w : words) w = rng();
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(words.data()),
                                                static_cast<std::streamsize>(words.size() * 8));
  }
  const std::string out = testing::TempDir() + "md5sum.out";
  ASSERT_EQ(std::system(("md5sum " + path + " > " + out).c_str()), 0);
  EXPECT_EQ(file_md5(path), slurp(out).substr(0, 32));
  int asked = 0;
  try {
    file_md5(path, [&asked] { return ++asked == 3; });
    FAIL() << "an MD5 taken whole though cancelled";
  } catch (const InfrastructureError& e) {
    EXPECT_NE(std::string(e.what()).find("its MD5 was not taken (cancelled)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(asked, 3) << "read on after the cancel";  // of 4 blocks
  asked = 0;
  file_md5(path, [&asked] { return ++asked > 100; });
  EXPECT_EQ(asked, 4) << "once before each block read";
  EXPECT_THROW(file_md5(testing::TempDir() + "no_such_file"), InfrastructureError);
}

TEST(AwsCredentials, NoneIsOneClearError) {
  const ScopedEnv env({{"AWS_ACCESS_KEY_ID", nullptr}, {"AWS_SECRET_ACCESS_KEY", nullptr},
                       {"AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"}, {"AWS_PROFILE", nullptr},
                       {"AWS_EC2_METADATA_DISABLED", "true"}});
  try {
    AwsCredentialProvider p;
    ADD_FAILURE() << "no credentials were accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no AWS credentials"), std::string::npos) << e.what();
  }
  const ScopedEnv half({{"AWS_ACCESS_KEY_ID", "AKID"}});
  EXPECT_THROW(AwsCredentialProvider(), UsageError);
}

// The endpoint as AWS's SDKs choose it: the config's key, then AWS_ENDPOINT_URL_S3, then
// AWS_ENDPOINT_URL, else AWS S3; AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true ignores both.
TEST(S3Endpoint, ConfigThenServiceVariableThenGeneral) {
  const std::string aws_config = testing::TempDir() + "endpoint_aws_config";
  const ScopedEnv none({{"AWS_ENDPOINT_URL_S3", nullptr}, {"AWS_ENDPOINT_URL", nullptr},
                        {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", nullptr}, {"AWS_PROFILE", "lab"},
                        {"AWS_CONFIG_FILE", aws_config.c_str()}});
  std::filesystem::remove(aws_config);
  EXPECT_EQ(resolve_s3_endpoint("", "checkpoint.s3_endpoint").url, "");
  // The profile's endpoint_url (as the SDKs read ~/.aws/config), below both variables.
  std::ofstream(aws_config) << "[default]\nendpoint_url = http://other:1\n[profile lab]\nregion = eu-west-1\n"
                               "endpoint_url = http://profile:9000\n";
  EXPECT_EQ(resolve_s3_endpoint("", "checkpoint.s3_endpoint").url, "http://profile:9000");
  EXPECT_EQ(resolve_s3_endpoint("", "checkpoint.s3_endpoint").from, "endpoint_url of profile [profile lab] of " + aws_config);
  {
    const ScopedEnv ignored({{"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"}});
    EXPECT_EQ(resolve_s3_endpoint("", "checkpoint.s3_endpoint").url, "");
  }
  const ScopedEnv general({{"AWS_ENDPOINT_URL", "http://general:9000"}});
  EXPECT_EQ(resolve_s3_endpoint("", "checkpoint.s3_endpoint").url, "http://general:9000");
  EXPECT_EQ(resolve_s3_endpoint("", "checkpoint.s3_endpoint").from, "AWS_ENDPOINT_URL");
  const ScopedEnv service({{"AWS_ENDPOINT_URL_S3", "https://s3.store:8443"}});
  EXPECT_EQ(resolve_s3_endpoint("", "checkpoint.s3_endpoint").url, "https://s3.store:8443");
  EXPECT_EQ(resolve_s3_endpoint("", "checkpoint.s3_endpoint").from, "AWS_ENDPOINT_URL_S3");
  EXPECT_EQ(resolve_s3_endpoint("http://mine:1", "data.s3_endpoint").url, "http://mine:1");
  EXPECT_EQ(resolve_s3_endpoint("http://mine:1", "data.s3_endpoint").from, "data.s3_endpoint");
  {
    const ScopedEnv ignored({{"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"}});
    EXPECT_EQ(resolve_s3_endpoint("", "checkpoint.s3_endpoint").url, "");
  }
  const ScopedEnv bad({{"AWS_ENDPOINT_URL_S3", "s3.store:8443"}});
  try {
    resolve_s3_endpoint("", "checkpoint.s3_endpoint");
    ADD_FAILURE() << "a URL without its scheme was taken";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("AWS_ENDPOINT_URL_S3 must be an http:// or https:// URL"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(url_host("http://a.b:9000/bucket/key"), "a.b");
  EXPECT_EQ(url_host("https://bkt.s3.us-east-1.amazonaws.com/k"), "bkt.s3.us-east-1.amazonaws.com");
  EXPECT_EQ(url_host("http://[::1]:9000"), "[::1]");
  EXPECT_EQ(url_host("https://bkt.s3.us-east-1.amazonaws.com?max-keys=1"), "bkt.s3.us-east-1.amazonaws.com");
}

// An endpoint whose host does not resolve (.invalid never does, RFC 2606) is one clear
// error at once, exit 2, naming the host and where it came from: not 120 s of retries and
// "a retry may succeed". data.s3_endpoint wins over checkpoint.s3_endpoint, which wins over
// the environment. Without any endpoint, AWS's host where this machine cannot resolve it.
TEST(S3Endpoint, AnUnresolvableHostIsOneErrorAtOnce) {
  // (An empty variable counts as unset, as for AWS's tools.)
  const std::string env = "env -u http_proxy -u https_proxy -u HTTP_PROXY -u HTTPS_PROXY -u ALL_PROXY -u all_proxy "
                          "-u AWS_IGNORE_CONFIGURED_ENDPOINT_URLS AWS_ACCESS_KEY_ID=AKIDENDPOINTTEST "
                          "AWS_SECRET_ACCESS_KEY=endpoint-test-secret AWS_EC2_METADATA_DISABLED=true AWS_REGION=us-east-1 ";
  const std::string variables = "AWS_ENDPOINT_URL=http://general.invalid:9000 "
                                "AWS_ENDPOINT_URL_S3=http://service.invalid:9000 ";
  const std::string train = "train --config configs/tiny.ini --train.steps=1 --data.cache_dir=" + testing::TempDir() +
                            "endpoint_cache --data.path=s3://bkt/corpus ";
  struct Case {
    std::string env, flags, expect;
  };
  const std::vector<Case> cases = {
      {variables, "", "the endpoint http://service.invalid:9000 (from AWS_ENDPOINT_URL_S3) names the host "
                      "service.invalid, which does not resolve"},
      {"AWS_ENDPOINT_URL=http://general.invalid:9000 AWS_ENDPOINT_URL_S3= ", "",
       "(from AWS_ENDPOINT_URL) names the host general.invalid"},
      {variables, "--checkpoint.s3_endpoint=http://ckpt.invalid:1",
       "the endpoint http://ckpt.invalid:1 (from checkpoint.s3_endpoint)"},
      {variables, "--checkpoint.s3_endpoint=http://ckpt.invalid:1 --data.s3_endpoint=http://data.invalid:2",
       "the endpoint http://data.invalid:2 (from data.s3_endpoint)"},
  };
  for (const Case& c : cases) {
    const CliRun r = run(train + c.flags, env + c.env, 60);
    EXPECT_EQ(r.exit_code, 2) << c.flags << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.expect << " in\n" << r.err;
    EXPECT_NE(r.err.find("in data.s3_endpoint (s3:// data), checkpoint.s3_endpoint, or the environment's "
                         "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL"), std::string::npos) << r.err;
    EXPECT_EQ(count(r.err, "trident: error"), 1) << r.err;
    EXPECT_EQ((r.out + r.err).find("endpoint-test-secret"), std::string::npos) << "the secret in the output";
  }
  // No endpoint: AWS S3's host for the bucket, where this machine has no name for it.
  addrinfo* found = nullptr;
  const bool aws_resolves = getaddrinfo("bkt.s3.us-east-1.amazonaws.com", "443", nullptr, &found) == 0;
  if (found != nullptr) freeaddrinfo(found);
  if (aws_resolves) return;  // a machine that reaches AWS: the case of one that cannot is not here
  const CliRun aws = run(train, env + "AWS_ENDPOINT_URL= AWS_ENDPOINT_URL_S3= ", 60);
  EXPECT_EQ(aws.exit_code, 2) << aws.out << aws.err;
  EXPECT_NE(aws.err.find("the host bkt.s3.us-east-1.amazonaws.com (AWS S3, region us-east-1, for s3://bkt) does not "
                         "resolve"), std::string::npos) << aws.err;
}

// ---- against the server -------------------------------------------------------------

std::string md5_hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, EVP_md5(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < length; i++) hex += "0123456789abcdef"[digest[i] >> 4], hex += "0123456789abcdef"[digest[i] & 15];
  return hex;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

class S3Store : public testing::Test {
 protected:
  void SetUp() override {
    endpoint_ = env_or_empty("TRIDENT_TEST_S3_ENDPOINT");
    if (endpoint_.empty()) GTEST_SKIP() << "no S3 server (tests/s3/test_s3.sh starts one)";
    // A bucket of this test's own.
    std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::isalnum(c) ? std::tolower(c) : '-'; });
    bucket_ = ("t-" + name + "-" + std::to_string(getpid())).substr(0, 63);
    client_ = make_client(endpoint_);
    client_->create_bucket();
  }

  std::unique_ptr<S3Client> make_client(const std::string& endpoint, size_t part_bytes = kS3MinPartBytes) {
    S3Settings s;
    s.endpoint = endpoint;
    s.region = "us-east-1";
    s.part_bytes = part_bytes;
    s.parallel = 4;
    s.retry_s = 30;
    return std::make_unique<S3Client>(bucket_, s, std::make_shared<AwsCredentialProvider>());
  }

  // A file of `bytes` random bytes; its CRC-32.
  uint32_t random_file(const std::string& path, size_t bytes, unsigned seed = 1) {
    std::vector<char> data(bytes);
    std::mt19937 random(seed);
    for (char& c : data) c = static_cast<char>(random());
    std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
    return static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(bytes)));
  }

  // Debian's awscli (/usr/bin/aws, not another on PATH), a client that is not ours.
  std::string aws(const std::string& args) {
    const std::string out = testing::TempDir() + "aws.out";
    const int status = std::system(("/usr/bin/aws --endpoint-url " + endpoint_ + " " + args + " > " + out + " 2>&1").c_str());
    EXPECT_EQ(WEXITSTATUS(status), 0) << "aws " << args << ": " << slurp(out);
    return slurp(out);
  }

  std::string endpoint_, bucket_;
  std::unique_ptr<S3Client> client_;
};

TEST_F(S3Store, ObjectsListedReadAndDeleted) {
  client_->check_bucket();
  client_->put_object("runs/a/latest", "step_00000010\n");
  client_->put_object("runs/a/step_00000010/manifest.json", "{}");
  client_->put_object("runs/a b/odd+key~", "x");  // encoded as SigV4 wants
  EXPECT_EQ(client_->get_object("runs/a/latest").value_or(""), "step_00000010\n");
  EXPECT_EQ(client_->get_object("runs/a b/odd+key~").value_or(""), "x");
  EXPECT_FALSE(client_->get_object("runs/a/missing").has_value());
  EXPECT_EQ(client_->object_size("runs/a/step_00000010/manifest.json").value_or(0), 2u);
  EXPECT_FALSE(client_->object_size("runs/a/missing").has_value());
  const std::vector<S3Object> listed = client_->list("runs/a/");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].key, "runs/a/latest");
  EXPECT_EQ(listed[1].size, 2u);
  // In pages of 2 (marker paging: s3rver cannot make V2's continuation tokens), every key
  // once, in order. (Not across "runs/a b/": s3rver does not list in byte order there.)
  for (int i = 0; i < 5; i++) client_->put_object("runs/p/" + std::to_string(i), std::string(i, 'p'));
  const std::vector<S3Object> paged = client_->list("runs/p/", 2);
  ASSERT_EQ(paged.size(), 5u);
  for (int i = 0; i < 5; i++) EXPECT_EQ(paged[i].key + " " + std::to_string(paged[i].size),
                                        "runs/p/" + std::to_string(i) + " " + std::to_string(i));
  client_->delete_object("runs/a/latest");
  client_->delete_object("runs/a/latest");  // twice: gone is what was asked
  EXPECT_EQ(client_->list("runs/a/").size(), 1u);
  // awscli sees what we stored.
  const nlohmann::json j = nlohmann::json::parse(aws("s3api list-objects-v2 --bucket " + bucket_ + " --prefix runs/"));
  EXPECT_EQ(j["Contents"].size(), 7u);
}

TEST_F(S3Store, MultipartUploadAndRangedDownload) {
  const std::string file = testing::TempDir() + "node_0000.h5", back = testing::TempDir() + "back.h5";
  const size_t bytes = (size_t{12} << 20) + 12345;  // three parts of 5 MiB, the last short
  const uint32_t crc = random_file(file, bytes);
  const S3Transfer up = client_->upload_file(file, "ckpt/node_0000.h5");
  EXPECT_EQ(up.parts, 3);
  EXPECT_EQ(up.bytes, bytes);
  EXPECT_EQ(up.crc32, crc);  // combined from the parts' CRCs
  EXPECT_EQ(client_->counts().post.load(), 2u);  // start and complete
  // awscli: one object of the file's size, with a multipart ETag ("-3"; s3rver stores the
  // parts as one object and gives the whole file's MD5), and its copy is the file byte for
  // byte.
  const nlohmann::json head = nlohmann::json::parse(aws("s3api head-object --bucket " + bucket_ + " --key ckpt/node_0000.h5"));
  EXPECT_EQ(head["ContentLength"].get<uint64_t>(), bytes);
  const std::string etag = head["ETag"].get<std::string>();
  EXPECT_TRUE(etag.find("-3") != std::string::npos || etag == "\"" + md5_hex(slurp(file)) + "\"") << head.dump();
  aws("s3 cp s3://" + bucket_ + "/ckpt/node_0000.h5 " + back);
  EXPECT_EQ(slurp(back), slurp(file));
  fs::remove(back);
  const S3Transfer down = client_->download_file("ckpt/node_0000.h5", bytes, back);
  EXPECT_EQ(down.crc32, crc);
  EXPECT_EQ(down.parts, 3);
  EXPECT_EQ(slurp(back), slurp(file));
  // Asked for more than the object holds (a manifest naming a longer file): refused.
  EXPECT_THROW(client_->download_file("ckpt/node_0000.h5", bytes + 100, back), S3Error);
  // A small file is one PUT.
  const std::string small = testing::TempDir() + "small";
  random_file(small, 1000, 2);
  EXPECT_EQ(client_->upload_file(small, "ckpt/small").parts, 1);
}

TEST_F(S3Store, WrongSecretAndMissingBucketAreClearErrors) {
  {
    const ScopedEnv wrong({{"AWS_SECRET_ACCESS_KEY", "not-the-secret"}});
    const auto client = make_client(endpoint_);
    try {
      client->check_bucket();
      ADD_FAILURE() << "a wrong secret key was accepted: the server does not check signatures";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("SignatureDoesNotMatch"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("not-the-secret"), std::string::npos) << "the secret in a message";
    }
  }
  bucket_ = "no-such-bucket-" + std::to_string(getpid());
  const auto missing = make_client(endpoint_);
  try {
    missing->check_bucket();
    ADD_FAILURE() << "a missing bucket was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("NoSuchBucket"), std::string::npos) << e.what();
  }
}

// The proxy in front of the server answers 503 Slow Down while told to (its control
// file): every request is retried until it gets through, and counted.
TEST_F(S3Store, SlowDownIsRetriedWithBackoff) {
  const std::string proxy = env_or_empty("TRIDENT_TEST_S3_PROXY"), control = env_or_empty("TRIDENT_TEST_S3_PROXY_CONTROL");
  if (proxy.empty()) GTEST_SKIP() << "no fault proxy (tests/s3/test_s3.sh starts one)";
  const auto client = make_client(proxy);
  const std::string file = testing::TempDir() + "part_file";
  const uint32_t crc = random_file(file, (size_t{11} << 20), 3);
  std::ofstream(control) << R"({"slowdown_requests": 6})";
  const S3Transfer up = client->upload_file(file, "slow/file");
  std::ofstream(control) << "{}";
  EXPECT_EQ(up.crc32, crc);
  EXPECT_EQ(client->counts().slowdowns.load(), 6u);
  EXPECT_GE(client->counts().retries.load(), 6u);
  EXPECT_EQ(client_->object_size("slow/file").value_or(0), size_t{11} << 20);
}

// CompleteMultipartUpload's two ways of failing: a 200 whose body is an <Error>
// (InternalError: sent again), and an answer lost after the store completed the upload
// (the retry gets 404 NoSuchUpload: the object with the ETag of these parts proves it
// done). Both uploads succeed; the objects are the files.
TEST_F(S3Store, CompletionFailuresAreToldFromSuccess) {
  const std::string proxy = env_or_empty("TRIDENT_TEST_S3_PROXY"), control = env_or_empty("TRIDENT_TEST_S3_PROXY_CONTROL");
  if (proxy.empty()) GTEST_SKIP() << "no fault proxy (tests/s3/test_s3.sh starts one)";
  const auto client = make_client(proxy);
  const std::string file = testing::TempDir() + "completed", back = testing::TempDir() + "completed_back";
  const size_t bytes = (size_t{11} << 20) + 7;
  const uint32_t crc = random_file(file, bytes, 4);
  const auto fault = [&](const std::string& name) {
    std::ofstream(control + ".new") << R"({")" + name + R"(": {"method": "POST", "path": "uploadId=", "requests": 1}})";
    fs::rename(control + ".new", control);
  };
  const std::string stats = env_or_empty("TRIDENT_TEST_S3_PROXY_STATS");
  for (const std::string name : {"error_in_200", "lose_answer"}) {
    fault(name);
    const uint64_t posts = client->counts().post.load();
    const S3Transfer up = client->upload_file(file, "complete/" + name);
    EXPECT_EQ(up.crc32, crc) << name;
    // The fault was met once: start, the completion it took, the completion again (a lost
    // answer's resend may be libcurl's own, on a fresh connection, and not counted here).
    const std::string counter = name == "lose_answer" ? "lost_answers" : "errors_in_200";
    EXPECT_EQ(nlohmann::json::parse(slurp(stats))[counter], 1) << slurp(stats);
    EXPECT_GE(client->counts().post.load() - posts, name == "lose_answer" ? 2u : 3u) << name;
    const S3Transfer down = client_->download_file("complete/" + name, bytes, back);
    EXPECT_EQ(down.crc32, crc) << name;
  }
  std::ofstream(control) << "{}";
}

// A server that does not answer: retried until retry_s, then one error naming it.
TEST_F(S3Store, UnreachableServerGivesUp) {
  S3Settings s;
  s.endpoint = "http://127.0.0.1:9";  // discard: nothing listens
  s.region = "us-east-1";
  s.retry_s = 1;
  S3Client client(bucket_, s, std::make_shared<AwsCredentialProvider>());
  try {
    client.put_object("x", "y");
    ADD_FAILURE() << "nothing answered, and the put succeeded";
  } catch (const S3Error& e) {
    EXPECT_EQ(e.status, 0);
    EXPECT_NE(std::string(e.what()).find("no answer"), std::string::npos) << e.what();
    EXPECT_GT(client.counts().retries.load(), 0u);
  }
  // At the start of a run: for a retry of the job (exit 3), not bad input (exit 2).
  try {
    client.check_bucket("runs/a/");
    ADD_FAILURE() << "nothing answered, and the bucket check passed";
  } catch (const UsageError& e) {
    ADD_FAILURE() << "a store that does not answer is not bad input: " << e.what();
  } catch (const InfrastructureError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be used"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trident
