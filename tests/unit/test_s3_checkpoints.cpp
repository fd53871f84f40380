// Checkpoints that outlive the cluster, through the executable, against a real S3 server
// (Ceph's RADOS Gateway, started by tests/s3/test_s3.sh) and checked by a client that is
// not ours (Debian's awscli): 8 ranks as 2 nodes upload one object per node; a new
// "cluster" (an empty checkpoint.dir) resumes from S3 bit for bit, and under another
// layout; the server stopped mid-upload, answering 503 Slow Down, or holding a corrupted
// or truncated object; bad credentials and bad input; a stop on a signal; ckpt and doctor
// on s3:// URIs. Without the server (TRIDENT_TEST_S3_ENDPOINT) the tests are skipped.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "checkpoint_helpers.h"
#include "child_process.h"
#include "ckpt/checkpoint.h"
#include "cli_helpers.h"
#include "storage/s3_client.h"

namespace fs = std::filesystem;

namespace trident {
namespace {

const std::string kTrain = "train --config configs/tiny.ini --model.n_layer=2 --model.d_model=64 "
                           "--train.global_batch=8 --log.every_steps=1 --log.val_batches=0 --log.peak_gflops=100 "
                           "--log.sample_every_steps=0 ";

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = testing::TempDir() + "s3ckpt_" + name;
  fs::remove_all(dir);
  fs::remove_all(dir + "_run");
  return dir;
}

// step -> loss at full precision, from metrics.jsonl.
std::map<int, double> logged_losses(const std::string& run_dir) {
  std::map<int, double> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("loss") && j.contains("step") && !j.contains("val_loss")) out[j["step"]] = j["loss"];
  }
  return out;
}

class S3Checkpoints : public testing::Test {
 protected:
  void SetUp() override {
    endpoint_ = env_or_empty("TRIDENT_TEST_S3_ENDPOINT");
    if (endpoint_.empty()) GTEST_SKIP() << "no S3 server (tests/s3/test_s3.sh starts one)";
    proxy_ = env_or_empty("TRIDENT_TEST_S3_PROXY");
    control_ = env_or_empty("TRIDENT_TEST_S3_PROXY_CONTROL");
    server_dir_ = env_or_empty("TRIDENT_TEST_S3_DIR");
    std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::isalnum(c) ? std::tolower(c) : '-'; });
    bucket_ = ("c-" + name + "-" + std::to_string(getpid())).substr(0, 63);
    S3Settings s;
    s.endpoint = endpoint_;
    s.region = "us-east-1";
    s.retry_s = 30;
    client_ = std::make_unique<S3Client>(bucket_, s, std::make_shared<AwsCredentialProvider>());
    client_->create_bucket();
    set_faults("{}");
  }
  void TearDown() override {
    if (!control_.empty()) set_faults("{}");
  }

  // The flags of a run uploading to s3://bucket/prefix (through the fault proxy if asked).
  std::string upload_flags(const std::string& prefix, bool through_proxy = false) const {
    return " --checkpoint.upload=s3://" + bucket_ + "/" + prefix +
           " --checkpoint.s3_endpoint=" + (through_proxy ? proxy_ : endpoint_) + " ";
  }
  // The proxy's faults (tests/s3/slowdown_proxy.py reads the file on every request).
  void set_faults(const std::string& json) const {
    if (control_.empty()) return;
    std::ofstream(control_ + ".new") << json;
    fs::rename(control_ + ".new", control_);
  }
  // Debian's awscli, a client that is not ours, against the server.
  std::string aws(const std::string& args, int expect = 0) const {
    const std::string out = testing::TempDir() + "aws_cli.out";
    const int status = std::system(("/usr/bin/aws --endpoint-url " + endpoint_ + " " + args + " > " + out + " 2>&1").c_str());
    EXPECT_EQ(WEXITSTATUS(status), expect) << "aws " << args << ": " << slurp(out);
    return slurp(out);
  }
  std::vector<std::string> keys(const std::string& prefix) const {
    const std::string listed = aws("s3api list-objects-v2 --bucket " + bucket_ + " --prefix " + prefix);
    std::vector<std::string> out;
    if (listed.find_first_not_of(" \n") == std::string::npos) return out;  // awscli prints nothing for no keys
    const nlohmann::json j = nlohmann::json::parse(listed);
    for (const auto& o : j.value("Contents", nlohmann::json::array())) out.push_back(o["Key"]);
    return out;
  }
  std::string s3_latest(const std::string& prefix) const { return client_->get_object(prefix + "/latest").value_or(""); }
  void gateway(const std::string& action) const {
    ASSERT_FALSE(server_dir_.empty());
    const std::string log = testing::TempDir() + "gateway.out";
    const int status = std::system(("bash tests/s3/s3_server.sh " + action + " " + server_dir_ + " > " + log + " 2>&1").c_str());
    ASSERT_EQ(WEXITSTATUS(status), 0) << action << ": " << slurp(log);
  }

  std::string endpoint_, proxy_, control_, server_dir_, bucket_;
  std::unique_ptr<S3Client> client_;
};

// 8 ranks as 2 nodes upload one object per node (not one per rank) and the manifest and
// latest after them; awscli finds them, byte for byte the files on disk. A new cluster (an
// empty checkpoint.dir) resumes from S3 and ends bit for bit like an uninterrupted run,
// and under another layout with the same losses.
TEST_F(S3Checkpoints, TwoNodesUploadAndANewClusterResumesFromS3) {
  const std::string layout = "--parallel.dp=2 --parallel.tp=2 --parallel.pp=2 --parallel.ranks_per_node=4 ";
  const std::string saved = fresh_dir("saved"), whole = fresh_dir("whole");
  const CliRun save = run(kTrain + layout + "--train.steps=2 --checkpoint.every_steps=2 --checkpoint.dir=" + saved +
                              " --log.run_dir=" + saved + "_run" + upload_flags("a"),
                          kMpirun + "8", 180);
  ASSERT_EQ(save.exit_code, 0) << save.out << save.err;
  // One PUT per node file, then manifest.json and latest: 4 requests (one object per rank
  // would be 8, then 2).
  EXPECT_NE(save.out.find("checkpoint: step 2 uploaded to s3://" + bucket_ + "/a/step_00000002: 2 node files"),
            std::string::npos) << save.out;
  EXPECT_NE(save.out.find(", 4 requests, 0 retried"), std::string::npos) << save.out;
  const std::vector<std::string> stored = keys("a/");
  EXPECT_EQ(stored, (std::vector<std::string>{"a/latest", "a/step_00000002/manifest.json", "a/step_00000002/node_0000.h5",
                                              "a/step_00000002/node_0001.h5"}));
  EXPECT_EQ(s3_latest("a"), "step_00000002\n");
  const Manifest m = read_manifest(saved + "/step_00000002");
  for (const ManifestFile& f : m.files) {
    const nlohmann::json head = nlohmann::json::parse(
        aws("s3api head-object --bucket " + bucket_ + " --key a/step_00000002/" + f.name));
    EXPECT_EQ(head["ContentLength"].get<uint64_t>(), f.bytes) << f.name;
    const std::string copy = saved + "_" + f.name;
    aws("s3 cp s3://" + bucket_ + "/a/step_00000002/" + f.name + " " + copy);
    EXPECT_EQ(slurp(copy), slurp(saved + "/step_00000002/" + f.name)) << f.name << " differs from what is on disk";
  }
  EXPECT_EQ(aws("s3 cp s3://" + bucket_ + "/a/step_00000002/manifest.json -"), slurp(saved + "/step_00000002/manifest.json"));
  // A second copy for the other layout, made by awscli.
  aws("s3 cp --recursive s3://" + bucket_ + "/a s3://" + bucket_ + "/b");

  const CliRun uninterrupted = run(kTrain + layout + "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.dir=" +
                                       whole + " --log.run_dir=" + whole + "_run",
                                   kMpirun + "8", 180);
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.err;
  const std::map<int, double> expected = logged_losses(whole + "_run");

  // The same layout on a new cluster: nothing on disk.
  const std::string fresh = fresh_dir("fresh");
  const CliRun resumed = run(kTrain + layout + "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.dir=" + fresh +
                                 " --log.run_dir=" + fresh + "_run" + upload_flags("a"),
                             kMpirun + "8", 180);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("resuming from S3 (s3://" + bucket_ + "/a): 2 node files"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from " + fresh + "/step_00000002"), std::string::npos) << resumed.out;
  const std::map<int, double> after = logged_losses(fresh + "_run");
  ASSERT_EQ(after.size(), 2u) << resumed.out;
  for (const auto& [step, loss] : after) EXPECT_EQ(loss, expected.at(step)) << "step " << step;  // bit for bit
  expect_identical(whole + "/step_00000004", fresh + "/step_00000004");
  EXPECT_EQ(s3_latest("a"), "step_00000004\n");

  // Another layout (4 ranks as 2 nodes, tp 2 x pp 2): each node leader fetches the files
  // its ranks read; the same losses as the uninterrupted run, to rounding.
  const std::string other = fresh_dir("other");
  const CliRun resharded = run(kTrain + "--parallel.dp=1 --parallel.tp=2 --parallel.pp=2 --parallel.ranks_per_node=2 "
                                        "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.dir=" + other +
                                   " --log.run_dir=" + other + "_run" + upload_flags("b"),
                               kMpirun + "4", 180);
  ASSERT_EQ(resharded.exit_code, 0) << resharded.out << resharded.err;
  EXPECT_NE(resharded.out.find("resuming from S3"), std::string::npos) << resharded.out;
  const std::map<int, double> other_losses = logged_losses(other + "_run");
  ASSERT_EQ(other_losses.size(), 2u) << resharded.out;
  for (const auto& [step, loss] : other_losses) EXPECT_NEAR(loss, expected.at(step), 2e-4) << "step " << step;

  // ckpt ls / inspect / export read S3 as they read a folder.
  const std::string uri = "s3://" + bucket_ + "/a --checkpoint.s3_endpoint=" + endpoint_;
  const CliRun ls = run("ckpt ls --checkpoint.dir=" + uri);
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_TRUE(std::regex_search(ls.out, std::regex("step_00000002 +complete +2 +2 .* 2 2 2, 0"))) << ls.out;
  EXPECT_TRUE(std::regex_search(ls.out, std::regex("step_00000004 +complete +4 +2 .*<- latest"))) << ls.out;
  const CliRun inspect = run("ckpt inspect --step=2 --checkpoint.dir=" + uri);
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("step 2, gpt2 L2"), std::string::npos) << inspect.out;
  EXPECT_EQ(count(inspect.out, ", verified"), 2) << inspect.out;
  const CliRun exported = run("ckpt export --checkpoint.dir=" + uri + " --out=" + other + "_export.h5");
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_TRUE(fs::exists(other + "_export.h5"));
}

// The gateway stopped while step 40's node files go up (the proxy holds them 3 s on
// the way, so they meet a stopped gateway): training goes on, the upload is given up
// with a warning (S3's latest still names step 20), the checkpoints after it wait, and
// once the gateway is back the next checkpoint uploads.
TEST_F(S3Checkpoints, ServerStoppedDuringAnUploadTrainingGoesOn) {
  if (proxy_.empty() || server_dir_.empty()) GTEST_SKIP() << "no fault proxy or server folder";
  const std::string dir = fresh_dir("stopped");
  set_faults(R"({"delay_ms": 3000, "delay_path": "/p/step_00000040/"})");
  // Steps of 40 ms or more (one rank slowed), so that training visibly goes on meanwhile.
  ChildProcess job("TRIDENT_TEST_SLOW_RANK=0 TRIDENT_TEST_SLOW_MS=40 " + kMpirun +
                   "4 -x TRIDENT_TEST_SLOW_RANK -x TRIDENT_TEST_SLOW_MS " + trident_bin() + " " + kTrain +
                   "--parallel.dp=2 --parallel.pp=2 --parallel.ranks_per_node=2 --train.steps=160 "
                   "--checkpoint.every_steps=20 --checkpoint.keep_last=0 --checkpoint.s3_retry_s=5 "
                   "--checkpoint.s3_part_mb=5 --checkpoint.dir=" + dir + " --log.run_dir=" + dir + "_run" +
                   upload_flags("p", /*through_proxy=*/true));
  ASSERT_TRUE(job.wait_for_output("checkpoint: step 20 uploaded", 120));
  ASSERT_TRUE(job.wait_for_output("checkpoint: step 40 saved", 120));
  gateway("stop-gateway");
  {
    // Started again however this block ends: the tests after this one need the gateway.
    const std::unique_ptr<void, std::function<void(void*)>> back(this, [this](void*) { gateway("start-gateway"); });
    ASSERT_TRUE(job.wait_for_output("checkpoint: warning: step 40 was not uploaded", 120));
  }
  ASSERT_TRUE(job.wait_for_exit(180));
  EXPECT_EQ(job.exit_code(), 0) << job.output();
  const std::string out = job.output();
  EXPECT_NE(out.find("S3's latest is step_00000020; the next checkpoint uploads again"), std::string::npos) << out;
  EXPECT_NE(out.find("checkpoint: step 60's upload waits for step 40's"), std::string::npos) << out;
  // Training went on while the upload was retried: steps logged between the save and the warning.
  const size_t saved = out.find("checkpoint: step 40 saved"), warned = out.find("checkpoint: warning: step 40");
  EXPECT_TRUE(std::regex_search(out.substr(saved, warned - saved), std::regex("step +(4[1-9]|[5-9][0-9])/160"))) << out;
  EXPECT_NE(out.find("checkpoint: step 160 uploaded"), std::string::npos) << out;
  EXPECT_EQ(s3_latest("p"), "step_00000160\n");
  EXPECT_EQ(find_latest_checkpoint(dir)->step, 160);
}

// 503 Slow Down for five PUTs: retried with backoff, counted, and the upload completes.
TEST_F(S3Checkpoints, SlowDownIsRetriedAndCounted) {
  if (proxy_.empty()) GTEST_SKIP() << "no fault proxy";
  const std::string dir = fresh_dir("slowdown");
  set_faults(R"({"slowdown_requests": 5, "slowdown_method": "PUT"})");
  const CliRun r = run(kTrain + "--train.steps=2 --checkpoint.every_steps=2 --checkpoint.dir=" + dir +
                           " --log.run_dir=" + dir + "_run" + upload_flags("s", true));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("5 retried (5 on 503 Slow Down)"), std::string::npos) << r.out;
  EXPECT_EQ(s3_latest("s"), "step_00000002\n");
  // Resumed: the step S3 holds is in the monitors' figures from the first step on, and
  // S3 does not lag the disk (nothing newer saved yet).
  const CliRun more = run(kTrain + "--train.steps=3 --checkpoint.every_steps=2 --checkpoint.dir=" + dir +
                          " --log.run_dir=" + dir + "_run" + upload_flags("s", true));
  ASSERT_EQ(more.exit_code, 0) << more.out << more.err;
  nlohmann::json last;
  std::ifstream in(dir + "_run/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) last = j;
  }
  EXPECT_EQ(last["step"], 3) << last;
  EXPECT_EQ(last["s3_step"], 2) << last;
  EXPECT_EQ(last["s3_lag_steps"], 0) << last;
}

// Wrong credentials, a missing bucket, bad input: one clear error, exit 2, on every rank,
// before any step.
TEST_F(S3Checkpoints, BadCredentialsBucketOrInputEndBeforeTraining) {
  const std::string dir = fresh_dir("bad");
  const std::string base = kTrain + "--train.steps=2 --checkpoint.every_steps=2 --checkpoint.dir=" + dir +
                           " --log.run_dir=" + dir + "_run";
  struct Case {
    std::string flags, env, expect;
  };
  const std::vector<Case> cases = {
      {upload_flags("x"), "AWS_SECRET_ACCESS_KEY=wrong-secret ", "SignatureDoesNotMatch"},
      {upload_flags("x"), "AWS_ACCESS_KEY_ID=NOSUCHKEY ", "InvalidAccessKeyId"},
      {" --checkpoint.upload=s3://no-such-bucket-" + std::to_string(getpid()) + "/x --checkpoint.s3_endpoint=" + endpoint_,
       "", "NoSuchBucket"},
      {" --checkpoint.upload=s3:/" + bucket_ + "/x", "", "is not an S3 URI"},
      {" --checkpoint.upload=s3://Bad_Bucket/x", "", "is not a bucket name S3 accepts"},
      {upload_flags("x") + "--checkpoint.s3_region=US-EAST", "", "is not a region name"},
      {" --checkpoint.upload=s3://" + bucket_ + "/x --checkpoint.s3_region=moon-base-1", "", "is not an AWS region"},
      {upload_flags("x") + "--checkpoint.s3_part_mb=4", "", "S3 refuses parts below 5 MiB"},
  };
  for (const Case& c : cases) {
    const CliRun r = run(base + c.flags, "env " + c.env + kMpirun + "2");
    EXPECT_EQ(r.exit_code, 2) << c.flags << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.flags << "\n" << r.err;
    EXPECT_EQ(count(r.err, "trident: error"), 1) << "said once: " << r.err;
    EXPECT_EQ(r.out.find("step 1/2"), std::string::npos) << "trained: " << r.out;
    EXPECT_EQ(r.err.find("wrong-secret"), std::string::npos) << "the secret in a message";
  }
}

// A corrupted object (step 6) and a truncated one (step 4) in S3: each refused by its
// CRC or size, the run falls back to step 2, as it would on disk.
TEST_F(S3Checkpoints, CorruptedOrTruncatedObjectsFallBackToTheCheckpointBefore) {
  const std::string dir = fresh_dir("corrupt");
  const std::string layout = "--parallel.pp=2 --parallel.ranks_per_node=1 ";  // two nodes, a stage each
  const CliRun save = run(kTrain + layout + "--train.steps=6 --checkpoint.every_steps=2 --checkpoint.keep_last=0 "
                                            "--checkpoint.dir=" + dir + " --log.run_dir=" + dir + "_run" + upload_flags("c"),
                          kMpirun + "2");
  ASSERT_EQ(save.exit_code, 0) << save.out << save.err;
  EXPECT_EQ(s3_latest("c"), "step_00000006\n");
  // Step 6: one byte flipped in node_0001.h5, same size. Step 4: node_0000.h5 cut short.
  std::string bytes = slurp(dir + "/step_00000006/node_0001.h5");
  bytes[bytes.size() / 2] ^= 0x40;
  std::ofstream(dir + "_flipped", std::ios::binary) << bytes;
  aws("s3 cp " + dir + "_flipped s3://" + bucket_ + "/c/step_00000006/node_0001.h5");
  bytes = slurp(dir + "/step_00000004/node_0000.h5");
  std::ofstream(dir + "_short", std::ios::binary) << bytes.substr(0, bytes.size() - 1000);
  aws("s3 cp " + dir + "_short s3://" + bucket_ + "/c/step_00000004/node_0000.h5");
  fs::remove_all(dir);
  const CliRun r = run(kTrain + layout + "--train.steps=8 --checkpoint.dir=" + dir + " --log.run_dir=" + dir + "_run" +
                           upload_flags("c"),
                       kMpirun + "2");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("node_0001.h5 does not match its manifest"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/c/step_00000006 in S3 cannot be loaded"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/c/step_00000004 in S3 cannot be loaded"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("resumed from " + dir + "/step_00000002"), std::string::npos) << r.out;
}

// SIGUSR1 (Slurm's warning before the time limit): the step's checkpoint is saved and
// uploaded before exit 0. The store answering 503 past checkpoint.upload_timeout_s at
// the end of a run: exit 3, the checkpoint complete on disk; the requeued job (Slurm's
// SLURM_RESTART_COUNT) finds the run complete and uploads it.
TEST_F(S3Checkpoints, TheLastUploadFinishesBeforeExitOrExitThree) {
  const std::string dir = fresh_dir("signal");
  ChildProcess job(trident_bin() + " " + kTrain + "--train.steps=100000 --checkpoint.dir=" + dir + " --log.run_dir=" +
                   dir + "_run" + upload_flags("g"));
  ASSERT_TRUE(job.wait_for_output("\nstep ", 120));
  kill(job.pid(), SIGUSR1);
  ASSERT_TRUE(job.wait_for_exit(180));
  EXPECT_EQ(job.exit_code(), 0) << job.output();
  const std::optional<Manifest> m = find_latest_checkpoint(dir);
  ASSERT_TRUE(m.has_value()) << job.output();
  EXPECT_NE(job.output().find("checkpoint: step " + std::to_string(m->step) + " uploaded"), std::string::npos) << job.output();
  EXPECT_EQ(s3_latest("g"), step_name(m->step) + "\n");

  if (proxy_.empty()) return;
  const std::string late = fresh_dir("late");
  set_faults(R"({"slowdown_seconds": 600, "slowdown_method": "PUT"})");
  const std::string args = kTrain + "--train.steps=2 --checkpoint.every_steps=2 --checkpoint.upload_timeout_s=2 "
                                    "--checkpoint.dir=" + late + " --log.run_dir=" + late + "_run" + upload_flags("h", true);
  const CliRun r = run(args);
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("did not finish within checkpoint.upload_timeout_s (2 s)"), std::string::npos) << r.err;
  EXPECT_EQ(find_latest_checkpoint(late)->step, 2);
  EXPECT_EQ(s3_latest("h"), "");
  set_faults("{}");
  const CliRun requeued = run(args, "env SLURM_RESTART_COUNT=1");
  EXPECT_EQ(requeued.exit_code, 0) << requeued.out << requeued.err;
  EXPECT_NE(requeued.out.find("step 2 is newer than S3's latest: uploading it"), std::string::npos) << requeued.out;
  EXPECT_EQ(s3_latest("h"), "step_00000002\n");

  // The last upload failing outright (retries given up after 1 s) is no better: exit 3.
  set_faults(R"({"slowdown_seconds": 600, "slowdown_method": "PUT"})");
  const std::string failed = fresh_dir("failed");
  const CliRun f = run(kTrain + "--train.steps=2 --checkpoint.every_steps=2 --checkpoint.s3_retry_s=1 --checkpoint.dir=" +
                       failed + " --log.run_dir=" + failed + "_run" + upload_flags("f", true));
  EXPECT_EQ(f.exit_code, 3) << f.out << f.err;
  EXPECT_NE(f.out.find("checkpoint: warning: step 2 was not uploaded"), std::string::npos) << f.out;
  EXPECT_NE(f.err.find("the upload of step 2 failed (the warning above); S3's latest is none"), std::string::npos) << f.err;
  set_faults("{}");
}

// No keys in the environment or a credentials file: the instance role's, from the
// metadata service (IMDSv2: a session token first; a stand-in, as no EC2 instance is
// reachable here), on rank 0 and the other node's leader, with the session token signed
// into every request, and fetched again as they near their expiry (4 minutes away).
TEST_F(S3Checkpoints, InstanceRoleCredentialsThroughImdsV2) {
  const std::string imds = env_or_empty("TRIDENT_TEST_IMDS_ENDPOINT"), stats = env_or_empty("TRIDENT_TEST_IMDS_STATS");
  if (imds.empty()) GTEST_SKIP() << "no stand-in metadata service";
  const std::string dir = fresh_dir("role");
  const CliRun r = run(kTrain + "--parallel.pp=2 --parallel.ranks_per_node=1 --train.steps=4 --checkpoint.every_steps=2 "
                                "--checkpoint.dir=" + dir + " --log.run_dir=" + dir + "_run" + upload_flags("r"),
                       "env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_DEFAULT_REGION -u AWS_REGION "
                       "AWS_EC2_METADATA_DISABLED=false AWS_EC2_METADATA_SERVICE_ENDPOINT=" + imds +
                           " AWS_SHARED_CREDENTIALS_FILE=" + dir + "_none AWS_CONFIG_FILE=" + dir + "_none " + kMpirun + "2");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("region us-east-1, credentials: instance role trident-test-role (metadata service), with a "
                       "session token"), std::string::npos) << r.out;
  EXPECT_EQ(s3_latest("r"), "step_00000004\n");
  const nlohmann::json s = nlohmann::json::parse(slurp(stats));
  EXPECT_EQ(s["unauthorized"], 0) << "a request without an IMDSv2 token: " << s;
  // Two nodes fetch them at the start; both fetch them again as they near expiry.
  EXPECT_GT(s["credentials"].get<int>(), 2) << s;
  EXPECT_EQ(r.out.find(env_or_empty("AWS_SECRET_ACCESS_KEY")), std::string::npos) << "the secret in the output";
}

// doctor: from every node, the bucket reachable and a probe written, read back, deleted.
TEST_F(S3Checkpoints, DoctorChecksTheBucketFromEveryNode) {
  const CliRun ok = run("doctor --expect_busbw=0.01 --parallel.ranks_per_node=1 --checkpoint.dir=" + fresh_dir("doctor") + upload_flags("d"),
                        kMpirun + "2");
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  EXPECT_EQ(count(ok.out, "| S3 "), 2) << ok.out;
  EXPECT_EQ(count(ok.out, "a 1 MiB probe written"), 2) << ok.out;
  EXPECT_TRUE(keys("d/").empty()) << "the probes were not deleted";
  const CliRun bad = run("doctor --checkpoint.dir=" + fresh_dir("doctor") + upload_flags("d"),
                         "env AWS_SECRET_ACCESS_KEY=wrong");
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  EXPECT_NE(bad.out.find("SignatureDoesNotMatch"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace trident
