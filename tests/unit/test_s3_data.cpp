// Training data in S3 (data/s3_data.h), through the executable, against a real S3 server
// (Ceph's RADOS Gateway from tests/s3/test_s3.sh, or npm's s3rver from
// tests/s3/test_s3rver.sh), the data put there by a client that is not ours (awscli).
// Without a server (TRIDENT_TEST_S3_ENDPOINT) the tests are skipped.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <vector>

#include "cli_helpers.h"
#include "data/s3_data.h"
#include "runtime/byte_size.h"
#include "storage/aws_credentials.h"
#include "storage/s3_client.h"

namespace fs = std::filesystem;

namespace trident {
namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

class S3Data : public testing::Test {
 protected:
  void SetUp() override {
    endpoint_ = env_or_empty("TRIDENT_TEST_S3_ENDPOINT");
    if (endpoint_.empty()) GTEST_SKIP() << "no S3 server (tests/s3/test_s3.sh starts one)";
    std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::isalnum(c) ? std::tolower(c) : '-'; });
    bucket_ = ("d-" + name + "-" + std::to_string(getpid())).substr(0, 63);
    dir_ = testing::TempDir() + "s3data";
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    aws("s3 mb s3://" + bucket_);
  }
  void aws(const std::string& args) const {
    const std::string out = dir_ + "/aws.out";
    const int status = std::system(("/usr/bin/aws --endpoint-url " + endpoint_ + " " + args + " > " + out + " 2>&1").c_str());
    ASSERT_EQ(WEXITSTATUS(status), 0) << "aws " << args << ": " << slurp(out);
  }
  // The fortunes prepared as a Megatron dataset at `prefix` on disk, put in the bucket by
  // awscli as megatron/fortunes (its .bin and .idx).
  void put_fortunes_in_s3(const std::string& prefix) const {
    const CliRun prepared = run("prepare --input /usr/share/games/fortunes --out " + prefix + " --data.tokenizer=byte");
    ASSERT_EQ(prepared.exit_code, 0) << prepared.err;
    aws("s3 cp " + prefix + ".bin s3://" + bucket_ + "/megatron/fortunes.bin");
    aws("s3 cp " + prefix + ".idx s3://" + bucket_ + "/megatron/fortunes.idx");
  }
  std::string endpoint_, bucket_, dir_;
  const std::string mpirun2 = "mpirun --oversubscribe --allow-run-as-root -np 2";
};

// Sizes in the copy's log lines: a small copy is not "0.000 GB".
TEST(S3DataLog, SizesAreInAUnitAPersonReads) {
  EXPECT_EQ(byte_size(1073741824.0), "1.074 GB");
  EXPECT_EQ(byte_size(2138000.0), "2.1 MB");
  EXPECT_EQ(byte_size(5240.0), "5.2 KB");
  EXPECT_EQ(byte_size(512.0), "512 bytes");
  EXPECT_EQ(byte_size(0.0), "0 bytes");
}

// The last step's line of a run's output.
std::string last_step(const std::string& out) {
  const size_t at = out.rfind("step 2/2 | loss ");
  return at == std::string::npos ? "" : out.substr(at, out.find(" | lr", at) - at);
}

// A Megatron dataset written to S3 by `prepare --out s3://...`, beside a decoy that shares
// its prefix: 2 ranks as 2 nodes on one cache folder copy its 3 files once before training
// (data.wait_for_copy), the decoy not at all, and train as from the same dataset prepared
// on disk; the next run finds them there; a copy changed on disk is copied again.
TEST_F(S3Data, TrainsFromItsCopyAsFromDisk) {
  const std::string prefix = dir_ + "/fortunes", cache = dir_ + "/cache";
  const CliRun prepared = run("prepare --input /usr/share/games/fortunes --out " + prefix + " --data.tokenizer=byte");
  ASSERT_EQ(prepared.exit_code, 0) << prepared.err;
  const CliRun to_s3 = run("prepare --input /usr/share/games/fortunes --out s3://" + bucket_ + "/megatron/fortunes "
                           "--data.tokenizer=byte --checkpoint.s3_endpoint=" + endpoint_ + " --data.cache_dir=" + dir_ +
                           "/prepared");
  ASSERT_EQ(to_s3.exit_code, 0) << to_s3.out << to_s3.err;
  EXPECT_NE(to_s3.out.find("prepare: uploaded s3://" + bucket_ + "/megatron/fortunes.bin/.idx/.json"), std::string::npos)
      << to_s3.out;
  aws("s3 cp " + prefix + ".bin s3://" + bucket_ + "/megatron/fortunes_v2.bin");
  const std::string train = "train --config configs/tiny.ini --model.n_layer=2 --model.d_model=64 --train.steps=2 "
                            "--log.val_batches=0 --log.sample_every_steps=0 --log.every_steps=1 --data.val_fraction=0 ";
  const std::string from_s3 = train + "--data.path=s3://" + bucket_ + "/megatron/fortunes --data.cache_dir=" + cache +
                              " --checkpoint.s3_endpoint=" + endpoint_ + " --parallel.ranks_per_node=1 "
                              "--data.wait_for_copy=true";
  // What prepare uploaded it left as the copy a run keeps: nothing to fetch there.
  const CliRun where_prepared = run(train + "--data.path=s3://" + bucket_ + "/megatron/fortunes --data.cache_dir=" +
                                    dir_ + "/prepared --checkpoint.s3_endpoint=" + endpoint_);
  ASSERT_EQ(where_prepared.exit_code, 0) << where_prepared.err;
  EXPECT_NE(where_prepared.out.find("data: the s3:// data's 3 objects are in " + dir_ + "/prepared already"),
            std::string::npos) << where_prepared.out;
  const CliRun local = run(train + "--data.path=" + prefix, mpirun2);
  ASSERT_EQ(local.exit_code, 0) << local.err;
  // data.val_path naming the same prefix: its objects are copied once, not twice.
  const CliRun first = run(from_s3 + " --data.val_path=s3://" + bucket_ + "/megatron/fortunes", mpirun2);
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  EXPECT_EQ(count(first.out, "data: copied 3 objects, "), 1) << first.out;  // the two leaders' total: each object once
  EXPECT_EQ(count(first.out, "data: copied "), 1) << first.out;
  EXPECT_FALSE(fs::exists(cache + "/" + bucket_ + "/megatron/fortunes_v2.bin"));
  EXPECT_EQ(slurp(cache + "/" + bucket_ + "/megatron/fortunes.bin"), slurp(prefix + ".bin"));
  EXPECT_FALSE(last_step(local.out).empty()) << local.out;
  EXPECT_EQ(last_step(first.out), last_step(local.out));

  const CliRun again = run(from_s3, mpirun2);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("data: the s3:// data's 3 objects are in " + cache + " already"), std::string::npos)
      << again.out;
  {  // one byte of the copy changed in place (its size kept)
    std::fstream f(cache + "/" + bucket_ + "/megatron/fortunes.idx", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  const CliRun repaired = run(from_s3, mpirun2);
  ASSERT_EQ(repaired.exit_code, 0) << repaired.err;
  EXPECT_NE(repaired.out.find("data: copied 1 object,"), std::string::npos) << repaired.out;
  EXPECT_EQ(last_step(repaired.out), last_step(local.out));
}

// By default training does not wait for the token file's copy: 2 ranks on one node read it
// with ranged GETs until the node leader's copy (held until step 3 here) is complete, then
// from the copy, with every loss as from disk; a killed run's .partial is removed first;
// the next run finds the copy there.
TEST_F(S3Data, TrainsWhileItsTokenFileIsCopied) {
  const std::string prefix = dir_ + "/fortunes", cache = dir_ + "/cache";
  ASSERT_NO_FATAL_FAILURE(put_fortunes_in_s3(prefix));
  const std::string train = "train --config configs/tiny.ini --model.n_layer=2 --model.d_model=64 --train.steps=6 "
                            "--log.val_batches=0 --log.sample_every_steps=0 --log.every_steps=1 --data.val_fraction=0 ";
  const CliRun local = run(train + "--data.path=" + prefix, mpirun2);
  ASSERT_EQ(local.exit_code, 0) << local.err;
  const std::string from_s3 = train + "--data.path=s3://" + bucket_ + "/megatron/fortunes --data.cache_dir=" + cache +
                              " --checkpoint.s3_endpoint=" + endpoint_;
  // What a killed run of this host left of its copy: removed before the copy starts.
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  const std::string stale = cache + "/" + bucket_ + "/megatron/fortunes.bin.partial." + host + ".99999";
  fs::create_directories(fs::path(stale).parent_path());
  std::ofstream(stale) << "a killed run's";
  // Another host's, on a folder they share: its copy may be under way; left alone.
  const std::string others = cache + "/" + bucket_ + "/megatron/fortunes.bin.partial.another-" + host + ".99999";
  std::ofstream(others) << "another host's";
  // data.val_path naming the same prefix: one token file copied, once.
  const CliRun copying = run(from_s3 + " --data.val_path=s3://" + bucket_ + "/megatron/fortunes",
                             mpirun2 + " -x TRIDENT_TEST_DATA_COPY_AT_STEP=3");
  ASSERT_EQ(copying.exit_code, 0) << copying.out << copying.err;
  const std::string& out = copying.out;
  const size_t starts = out.find("data: training starts while 1 token file"),
               step2 = out.find("step 2/6"),
               copied = out.find("data: copied s3://" + bucket_ + "/megatron/fortunes.bin in the background"),
               switched = out.find("data: s3://" + bucket_ + "/megatron/fortunes: its copy is complete, read from " +
                                   cache + "/" + bucket_ + "/megatron/fortunes.bin from now on"),
               step3 = out.find("step 3/6");
  ASSERT_NE(starts, std::string::npos) << out;
  ASSERT_NE(copied, std::string::npos) << out;
  ASSERT_NE(switched, std::string::npos) << out;
  EXPECT_LT(starts, step2) << out;
  EXPECT_LT(step2, copied) << "steps 1 and 2 ran on the streamed file\n" << out;
  EXPECT_LT(copied, switched) << out;
  EXPECT_LT(switched, step3) << "step 3 read the copy\n" << out;
  EXPECT_EQ(count(out, " in the background ("), 1) << out;
  EXPECT_EQ(step_losses(out), step_losses(local.out));
  EXPECT_EQ(step_losses(out).size(), 6u) << out;
  EXPECT_EQ(slurp(cache + "/" + bucket_ + "/megatron/fortunes.bin"), slurp(prefix + ".bin"));
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_EQ(slurp(others), "another host's");
  const CliRun again = run(from_s3 + " --data.val_path=s3://" + bucket_ + "/megatron/fortunes", mpirun2);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("data: the s3:// data's 2 objects are in " + cache + " already"), std::string::npos)
      << again.out;  // each once, though data.val_path names them too
  EXPECT_EQ(again.out.find("ranged GETs"), std::string::npos) << again.out;
  EXPECT_EQ(step_losses(again.out), step_losses(local.out));
}

// What reaches the server, counted by tests/s3/slowdown_proxy.py in front of it: one rank
// reads the token file with ranged GETs until its copy (held to step 3) is complete, then
// makes none: the GETs of the file's ranges the server saw are exactly those the switch
// line counts (the copy's own GET, of the whole file, aside).
TEST_F(S3Data, NoRangedGetAfterTheCopyIsComplete) {
  const std::string proxy = env_or_empty("TRIDENT_TEST_S3_PROXY"), stats = env_or_empty("TRIDENT_TEST_S3_PROXY_STATS");
  if (proxy.empty() || stats.empty()) GTEST_SKIP() << "no fault proxy (tests/s3/test_s3.sh starts one)";
  const std::string prefix = dir_ + "/fortunes", cache = dir_ + "/cache";
  ASSERT_NO_FATAL_FAILURE(put_fortunes_in_s3(prefix));
  const CliRun copying = run("train --config configs/tiny.ini --model.n_layer=2 --model.d_model=64 --train.steps=6 "
                             "--log.val_batches=0 --log.sample_every_steps=0 --log.every_steps=1 --data.val_fraction=0 "
                             "--data.path=s3://" + bucket_ + "/megatron/fortunes --data.cache_dir=" + cache +
                             " --checkpoint.s3_endpoint=" + proxy,
                             "env TRIDENT_TEST_DATA_COPY_AT_STEP=3");
  ASSERT_EQ(copying.exit_code, 0) << copying.out << copying.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(copying.out, m, std::regex("its copy is complete, read from .* from now on "
                                                           "\\(streamed from S3: ([0-9]+) ranged GETs")))
      << copying.out;
  const size_t before = std::stoul(m[1]);
  EXPECT_GT(before, 0u);
  EXPECT_LT(copying.out.find("its copy is complete"), copying.out.find("step 3/6")) << copying.out;
  const uint64_t size = fs::file_size(prefix + ".bin");
  const std::string whole = "bytes=0-" + std::to_string(size - 1);
  const nlohmann::json seen = nlohmann::json::parse(slurp(stats));
  const std::string path = "/" + bucket_ + "/megatron/fortunes.bin";
  ASSERT_TRUE(seen["ranges"].contains(path)) << seen.dump();
  size_t streamed = 0, copies = 0;
  for (const auto& range : seen["ranges"][path]) (range == whole ? copies : streamed)++;
  EXPECT_EQ(copies, 1u) << seen["ranges"][path].dump();
  EXPECT_EQ(streamed, before) << "ranged GETs after the switch\n" << seen["ranges"][path].dump();
}

// A node leader's background copy (copy_in_background) skips an object whose copy another
// leader finished meanwhile (current: its record's ETag, size and time), leaving its bytes
// as they are; without that record it copies the object over them.
TEST_F(S3Data, ALeaderSkipsACopyFinishedMeanwhile) {
  const std::string prefix = dir_ + "/fortunes", cache = dir_ + "/cache";
  ASSERT_NO_FATAL_FAILURE(put_fortunes_in_s3(prefix));
  S3Settings settings;
  settings.endpoint = endpoint_;
  settings.region = "us-east-1";
  S3Client client(bucket_, settings, std::make_shared<AwsCredentialProvider>());
  std::vector<S3Object> bin;
  for (const S3Object& o : client.list("megatron/fortunes.bin")) bin.push_back(o);
  ASSERT_EQ(bin.size(), 1u);
  const std::string copy = cache + "/" + bucket_ + "/megatron/fortunes.bin";
  fs::create_directories(fs::path(copy).parent_path());
  const std::string other_leaders(bin[0].size, 'x');  // stands for a finished copy: its bytes are not looked at
  std::ofstream(copy, std::ios::binary) << other_leaders;
  remember_copy(cache, bucket_, bin[0].key, bin[0].etag, bin[0].size);
  // What it says (a copy made, or one that failed and is left) tells a skip from a failure.
  const auto copied = [&] {
    testing::internal::CaptureStdout();
    testing::internal::CaptureStderr();
    copy_in_background(bucket_, bin, cache, settings, "host.1", /*announce=*/true)->wait();
    const std::string said = testing::internal::GetCapturedStdout() + testing::internal::GetCapturedStderr();
    EXPECT_EQ(said.find("failed"), std::string::npos) << said;
    return count(said, "data: copied s3://" + bucket_ + "/megatron/fortunes.bin in the background");
  };
  EXPECT_EQ(copied(), 0);
  EXPECT_EQ(slurp(copy), other_leaders) << "copied again";
  ASSERT_TRUE(fs::remove_all(cache + "/.trident-s3") > 0);  // the records (a copy without one is not current)
  EXPECT_EQ(copied(), 1);
  EXPECT_EQ(slurp(copy), slurp(prefix + ".bin"));
  for (const auto& e : fs::recursive_directory_iterator(cache))
    EXPECT_EQ(e.path().filename().string().find(".partial"), std::string::npos) << e.path() << " left";
}

// data.stream: the same Megatron prefix read with ranged GETs as the batches need them,
// on 2 ranks: the same losses as from disk, nothing copied, and the validation batches
// (the same at both evaluations) the second time from the cache.
TEST_F(S3Data, StreamsAMegatronPrefixAsFromDisk) {
  const std::string prefix = dir_ + "/fortunes", cache = dir_ + "/cache";
  ASSERT_NO_FATAL_FAILURE(put_fortunes_in_s3(prefix));
  const std::string train = "train --config configs/tiny.ini --model.n_layer=2 --model.d_model=64 --train.steps=2 "
                            "--log.val_batches=4 --log.val_every_steps=1 --log.sample_every_steps=0 "
                            "--log.every_steps=1 ";
  const CliRun local = run(train + "--data.path=" + prefix, mpirun2);
  ASSERT_EQ(local.exit_code, 0) << local.err;
  const CliRun streamed = run(train + "--data.path=s3://" + bucket_ + "/megatron/fortunes --data.stream=true "
                              "--data.cache_dir=" + cache + " --checkpoint.s3_endpoint=" + endpoint_, mpirun2);
  ASSERT_EQ(streamed.exit_code, 0) << streamed.out << streamed.err;
  EXPECT_NE(streamed.out.find("data: streaming s3://" + bucket_ + "/megatron/fortunes (data.stream"), std::string::npos)
      << streamed.out;
  EXPECT_NE(streamed.out.find("tokens, streamed;"), std::string::npos) << streamed.out;
  EXPECT_FALSE(last_step(local.out).empty()) << local.out;
  EXPECT_EQ(last_step(streamed.out), last_step(local.out));
  const auto val_losses = [](const std::string& out) {
    std::vector<std::string> v;
    const std::regex re("val loss ([0-9.]+)");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it) v.push_back((*it)[1]);
    return v;
  };
  EXPECT_EQ(val_losses(streamed.out), val_losses(local.out));
  EXPECT_GE(val_losses(local.out).size(), 2u) << local.out;
  EXPECT_FALSE(fs::exists(cache + "/" + bucket_)) << "nothing is copied";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(streamed.out, m, std::regex("streamed from S3: ([0-9]+) ranged GETs, ([0-9.]+) MB fetched "
                                                            "for ([0-9.]+) MB read \\(([0-9.]+)% from the cache\\)")))
      << streamed.out;
  EXPECT_GT(std::stoi(m[1]), 0);
  EXPECT_GT(std::stod(m[4]), 0);  // the second evaluation's batches came from the cache
  // Less than the whole 5 MB: 16 chunks for the unigram entropy, then the batches' sequences.
  EXPECT_LT(std::stod(m[2]), 4.0);
  EXPECT_LT(std::stod(m[2]), std::stod(m[3]));
  std::printf("%s\n", m[0].str().c_str());
}

// A dataset's token file or its folder in place of its prefix: train says to pass the
// prefix, as for a local path (the store named by data.s3_endpoint, or by the environment's
// AWS_ENDPOINT_URL_S3 as AWS's tools take it). doctor opens the data as train would,
// copying nothing: a prefix that names nothing fails its row, the dataset's index is read.
TEST_F(S3Data, DoctorAndTrainSayWhatToPass) {
  put_fortunes_in_s3(dir_ + "/fortunes");
  const std::string prefix = "s3://" + bucket_ + "/megatron/fortunes", cache = dir_ + "/cache";
  const std::string train = "train --config configs/tiny.ini --train.steps=1 --data.cache_dir=" + cache + " --data.path=";
  const CliRun bin = run(train + prefix + ".bin", "env AWS_ENDPOINT_URL_S3=" + endpoint_);
  EXPECT_EQ(bin.exit_code, 2) << bin.out << bin.err;
  EXPECT_NE(bin.err.find("data.path '" + prefix + ".bin' is one file of the Megatron indexed dataset '" + prefix +
                         "' (.bin + .idx): pass the prefix, --data.path=" + prefix),
            std::string::npos) << bin.err;
  const CliRun folder = run(train + "s3://" + bucket_ + "/megatron/ --data.s3_endpoint=" + endpoint_);
  EXPECT_EQ(folder.exit_code, 2) << folder.out << folder.err;
  EXPECT_NE(folder.err.find("data.path 's3://" + bucket_ + "/megatron/' is a folder holding the Megatron indexed "
                            "dataset '" + prefix + "' (.bin + .idx): pass the prefix, --data.path=" + prefix),
            std::string::npos) << folder.err;

  const std::string doctor = "doctor --data.cache_dir=" + cache + " --data.s3_endpoint=" + endpoint_ + " --data.path=";
  const CliRun nothing = run(doctor + "s3://" + bucket_ + "/nothing");
  EXPECT_EQ(nothing.exit_code, 1) << nothing.out << nothing.err;
  EXPECT_NE(nothing.out.find("| data | FAIL | data.path 's3://" + bucket_ + "/nothing' names no object in S3"),
            std::string::npos) << nothing.out;
  const CliRun good = run(doctor + prefix);
  EXPECT_EQ(good.exit_code, 0) << good.out << good.err;
  EXPECT_NE(good.out.find("| data | ok | Megatron indexed dataset " + prefix + " ("), std::string::npos) << good.out;
  EXPECT_NE(good.out.find("; s3:// 2 objects, "), std::string::npos) << good.out;
  EXPECT_FALSE(fs::exists(cache + "/" + bucket_)) << "doctor copied the data";
}

// A bucket that is not there, a key that names nothing, no credentials: one error on every
// rank, exit 2, before training, no secret in it.
TEST_F(S3Data, BadInputEndsBeforeTraining) {
  const std::string train = "train --config configs/tiny.ini --train.steps=1 --data.cache_dir=" + dir_ +
                            "/cache --checkpoint.s3_endpoint=" + endpoint_ + " --data.path=";
  struct Case {
    std::string path, env, expect;
  };
  const std::vector<Case> cases = {
      {"s3://no-such-bucket-" + std::to_string(getpid()) + "/x", "", "NoSuchBucket"},
      {"s3://" + bucket_ + "/nothing/here", "", "data.path 's3://" + bucket_ + "/nothing/here' names no object in S3"},
      {"'0.5 /usr/share/games/fortunes 0.5 s3://" + bucket_ + "/none'", "", "names no object in S3"},
      {"s3://" + bucket_ + "/x", "-u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY AWS_SHARED_CREDENTIALS_FILE=/nonexistent "
                               "AWS_EC2_METADATA_DISABLED=true ", "no AWS credentials"},
  };
  const std::string secret = env_or_empty("AWS_SECRET_ACCESS_KEY");
  for (const Case& c : cases) {
    const CliRun r = run(train + c.path, "env " + c.env + "mpirun --oversubscribe --allow-run-as-root -np 2");
    EXPECT_EQ(r.exit_code, 2) << c.path << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.path << "\n" << r.err;
    EXPECT_EQ(count(r.err, "trident: error"), 1) << r.err;
    EXPECT_EQ(r.out.find("step 1/1"), std::string::npos) << r.out;
    if (!secret.empty()) {
      EXPECT_EQ((r.out + r.err).find(secret), std::string::npos) << "the secret in the output";
    }
  }
}

}  // namespace
}  // namespace trident
