// Checkpoints end to end, through the executable: bit-exact resume, resharding under
// other layouts, async writes, signals, export/init_from, and every injected fault
// (abort between files, flipped bytes, truncation, a missing file, another model, a
// file-size limit) ending in one clear error or a fall back, never a lost checkpoint.
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <fstream>
#include <regex>

#include "checkpoint_helpers.h"
#include "child_process.h"
#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_pieces.h"
#include "ckpt/checkpoint_transport.h"
#include "config/config.h"
#include "model/parameters.h"
#include "model/transformer_spec.h"
#include "runtime/crc32.h"
#include "cli_helpers.h"
#include "train/resume_settings.h"

namespace fs = std::filesystem;

namespace trident {
namespace {

const std::string kTrain = "train --config configs/tiny.ini --model.n_layer=4 --train.global_batch=8 "
                           "--log.every_steps=1 --log.val_batches=0 --log.peak_gflops=100 --train.micro_batch=2 ";

std::string fresh_dir(const std::string& name) {
  const std::string dir = testing::TempDir() + "trident_ckpt_" + name;
  fs::remove_all(dir);
  return dir;
}

std::string run_dir_flag(const std::string& dir) { return " --log.run_dir=" + dir + "_run "; }

// A fresh folder holding only `from`'s checkpoint of step 2: a run given it resumes there.
std::string copy_of_step_2(const std::string& from, const std::string& name) {
  const std::string copy = fresh_dir(name);
  fs::create_directories(copy);
  fs::copy(from + "/step_00000002", copy + "/step_00000002", fs::copy_options::recursive);
  return copy;
}

// A run resumed at step 2 of 4 (`what` names its layout): steps 3 and 4 at the losses of
// the uninterrupted run.
// A checkpoint's declared buffers (StateKind::buffer: the expert biases), whole, by name.
std::map<std::string, std::vector<float>> buffers_of(const std::string& step_dir) {
  const Manifest m = read_manifest(step_dir);
  const ShardIndex index(m);
  const ParameterLayout saved(m.model, 0, m.dims.size(Axis::tp));
  std::map<std::string, std::vector<float>> out;
  for (const ParameterTensor& b : saved.buffers()) out[b.name] = index.canonical(m, saved, kBuffers, b.name);
  return out;
}

void expect_continues_like(const CliRun& r, const std::map<int, double>& reference, const std::string& what) {
  ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.err;
  const auto l = step_losses(r.out);
  ASSERT_EQ(l.size(), 2u) << what << "\n" << r.out;
  for (const auto& [step, loss] : l) EXPECT_NEAR(loss, reference.at(step), 2e-4) << what << " step " << step;
}

// The memory tier's CRC-32C: the standard check value, and the processor's instruction
// (8 bytes at a time) against the table (one byte a call) over 1 MiB of varied bytes.
TEST(Checkpoint, Crc32cIsTheCastagnoliChecksum) {
  EXPECT_EQ(crc32c_of(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_of(0, "", 0), 0u);
  std::vector<unsigned char> bytes(1 << 20);
  for (size_t i = 0; i < bytes.size(); i++) bytes[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  uint32_t bytewise = 0;
  for (unsigned char b : bytes) bytewise = crc32c_of(bytewise, &b, 1);
  EXPECT_EQ(crc32c_of(0, bytes.data(), bytes.size()), bytewise);
  EXPECT_EQ(crc32c_of(crc32c_of(0, bytes.data(), 1001), bytes.data() + 1001, bytes.size() - 1001), bytewise);
  bytes[12345] ^= 0x10;
  EXPECT_NE(crc32c_of(0, bytes.data(), bytes.size()), bytewise);
}

TEST(Checkpoint, ResumedRunEndsBitForBitLikeAnUninterruptedOne) {
  // The last: Lion (one state buffer, exp_avg) sharded by ZeRO-1.
  for (const std::string& layout : {std::string("1"), std::string("4 --parallel.dp=2 --parallel.pp=2 --parallel.zero=1"),
                                    std::string("4 --parallel.dp=2 --parallel.tp=2 --parallel.zero=2"),
                                    std::string("4 --parallel.dp=4 --parallel.zero=3"),
                                    std::string("2 --parallel.zero=1 --train.optimizer=lion --train.lr=3e-4")}) {
    const std::string whole = fresh_dir("whole"), halves = fresh_dir("halves");
    const std::string launcher = kMpirun + layout.substr(0, 1);
    const std::string flags = layout.size() > 1 ? layout.substr(2) : "";
    const CliRun a = run(kTrain + flags + " --train.steps=6 --checkpoint.every_steps=3 --checkpoint.dir=" + whole +
                             run_dir_flag(whole), launcher);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    const CliRun b1 = run(kTrain + flags + " --train.steps=3 --checkpoint.every_steps=3 --checkpoint.dir=" + halves +
                              run_dir_flag(halves), launcher);
    ASSERT_EQ(b1.exit_code, 0) << b1.err;
    const CliRun b2 = run(kTrain + flags + " --train.steps=6 --checkpoint.every_steps=3 --checkpoint.dir=" + halves +
                              run_dir_flag(halves), launcher);
    ASSERT_EQ(b2.exit_code, 0) << b2.err;
    EXPECT_NE(b2.out.find("resumed from " + halves + "/step_00000003"), std::string::npos) << b2.out;
    EXPECT_EQ(step_losses(b2.out).begin()->first, 4) << "the resumed run starts at step 4";
    expect_identical(whole + "/step_00000006", halves + "/step_00000006");
    const Manifest saved = read_manifest(whole + "/step_00000006");
    const bool lion = flags.find("lion") != std::string::npos;
    EXPECT_EQ(saved.optimizer, lion ? "lion" : "adamw");
    const std::vector<std::string> state = lion ? std::vector<std::string>{"exp_avg"}
                                                : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
    EXPECT_EQ(saved.optimizer_state, state);
    if (!lion) continue;
    // Another optimizer cannot take its state: one error, exit 2.
    const CliRun other = run(kTrain + "--parallel.zero=1 --train.steps=7 --checkpoint.dir=" + whole +
                                 run_dir_flag(whole), launcher);
    EXPECT_EQ(other.exit_code, 2) << other.out << other.err;
    EXPECT_NE(other.err.find("holds the state of the optimizer lion, not of train.optimizer = adamw; to change "
                             "optimizers, start from its parameters: --checkpoint.init_from=" + whole + "/step_00000006 "),
              std::string::npos) << other.err;
  }
}

TEST(Checkpoint, SavedOnTwoNodesLoadsUnderOtherLayouts) {
  const std::string saved = fresh_dir("reshard");
  // (dp, tp, pp) = (2, 2, 2) with ZeRO-1, 8 ranks as 2 nodes of 4.
  const CliRun save = run(kTrain + "--train.steps=3 --checkpoint.every_steps=3 --parallel.dp=2 --parallel.tp=2 "
                                   "--parallel.pp=2 --parallel.zero=1 --parallel.ranks_per_node=4 --checkpoint.dir=" +
                              saved + run_dir_flag(saved),
                          kMpirun + "8", 180);
  ASSERT_EQ(save.exit_code, 0) << save.err;
  const Manifest m = read_manifest(saved + "/step_00000003");
  EXPECT_EQ(m.files.size(), 2u);  // one file per node
  EXPECT_EQ(m.nodes, 2);
  std::map<int, double> reference;
  for (const std::string layout : {"1 --parallel.dp=1", "8 --parallel.dp=4 --parallel.tp=2 --parallel.zero=1",
                                   "8 --parallel.dp=1 --parallel.tp=2 --parallel.pp=4",
                                   "4 --parallel.dp=2 --parallel.pp=2 --parallel.zero=0",
                                   "4 --parallel.dp=4 --parallel.zero=2"}) {
    const std::string copy = fresh_dir("reshard_copy");
    fs::copy(saved, copy, fs::copy_options::recursive);
    const CliRun r = run(kTrain + layout.substr(2) + " --train.steps=5 --checkpoint.dir=" + copy + run_dir_flag(copy),
                         kMpirun + layout.substr(0, 1), 180);
    ASSERT_EQ(r.exit_code, 0) << layout << "\n" << r.err;
    const auto l = step_losses(r.out);
    ASSERT_EQ(l.size(), 2u) << layout << "\n" << r.out;
    if (reference.empty()) reference = l;
    for (const auto& [step, loss] : l) EXPECT_NEAR(loss, reference[step], 2e-4) << layout << " step " << step;
  }
}

// A checkpoint saved under ZeRO-3 (parameters, gradients and optimizer state sharded)
// continues under ZeRO 0, 1 and 2 (hybrid) as it would have under ZeRO-3, and one saved
// without ZeRO continues under ZeRO-3: still one file per node, the same tensors. A
// vocabulary of 1280 makes the tied table (1280 x 128 + 128 x 128 floats) 0.91 of a block:
// under ZeRO-3 at pp 1 it takes the blocks' windows padded to a block's size
// (StageSpec::windowed_ends), a layout the other stages do not have.
TEST(Checkpoint, ZeroStagesLoadEachOthersCheckpoints) {
  const std::string kTrain = trident::kTrain + "--model.vocab_size=1280 ";
  {  // the padding, from the layout of the runs' model: a block of width 128, 12 x 128^2 + 13 x 128
    const ModelConfig m = parse_command_line("train", {"--config", "configs/tiny.ini", "--model.n_layer=4",
                                                       "--model.vocab_size=1280"}).config.model;
    const size_t block = 12 * 128 * 128 + 13 * 128, tied = (1280 + 128) * 128;  // the table, the positions
    const ParameterLayout plain(transformer_spec(m)), padded(transformer_spec(m), 0, 1, 4, {.windowed_ends = true});
    ASSERT_EQ(plain.largest_block(), block);
    ASSERT_EQ(plain.units()[plain.embedding_unit()].size(), tied);
    EXPECT_EQ(padded.units()[padded.embedding_unit()].size(), block);  // 0.91 of a block, padded to it
  }
  const auto continue_from = [&kTrain](const std::string& saved, const std::string& layout) {
    const std::string copy = fresh_dir("zero_copy");
    fs::copy(saved, copy, fs::copy_options::recursive);
    const CliRun r = run(kTrain + layout.substr(2) + " --train.steps=5 --checkpoint.dir=" + copy + run_dir_flag(copy),
                         kMpirun + layout.substr(0, 1), 180);
    EXPECT_EQ(r.exit_code, 0) << layout << "\n" << r.err;
    return step_losses(r.out);
  };
  std::map<int, double> reference;
  for (const std::string save_layout : {"4 --parallel.dp=2 --parallel.pp=2 --parallel.zero=3", "1 --parallel.zero=0"}) {
    const std::string saved = fresh_dir("zero_saved");
    const CliRun save = run(kTrain + save_layout.substr(2) + " --train.steps=3 --checkpoint.every_steps=3 "
                                                            "--checkpoint.dir=" + saved + run_dir_flag(saved),
                            kMpirun + save_layout.substr(0, 1), 180);
    ASSERT_EQ(save.exit_code, 0) << save.err;
    for (const std::string layout : {"4 --parallel.dp=4 --parallel.zero=3", "1 --parallel.zero=0",
                                     "2 --parallel.dp=2 --parallel.zero=1",
                                     "4 --parallel.dp=4 --parallel.zero=2 --parallel.shard_size=2",
                                     "4 --parallel.dp=2 --parallel.tp=2 --parallel.zero=3"}) {
      const auto l = continue_from(saved, layout);
      ASSERT_EQ(l.size(), 2u) << save_layout << " -> " << layout;
      if (reference.empty()) reference = l;
      for (const auto& [step, loss] : l)
        EXPECT_NEAR(loss, reference[step], 2e-4) << save_layout << " -> " << layout << " step " << step;
    }
  }
}

// Pipeline schedules (issue 29): a checkpoint saved under the interleaved schedule with 2
// chunks per stage continues under 1F1B (1 chunk), interleaved with 4 chunks and ZB-H1,
// each to the losses of the uninterrupted run (names are global layers: chunks do not
// show in a checkpoint).
TEST(Checkpoint, SchedulesAndChunksLoadEachOthersCheckpoints) {
  const std::string base = "train --config configs/tiny.ini --model.n_layer=8 --train.global_batch=8 --log.every_steps=1 "
                           "--log.val_batches=0 --log.peak_gflops=100 --train.micro_batch=2 --parallel.pp=2 ";
  const std::string saved = fresh_dir("interleaved_saved");
  const CliRun a = run(base + "--parallel.schedule=interleaved --parallel.vpp=2 --train.steps=4 "
                              "--checkpoint.every_steps=2 --checkpoint.dir=" + saved + run_dir_flag(saved),
                       kMpirun + "2", 120);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.out.find("schedule interleaved with 2 chunks per stage; stage 0 holds layers 0..1, 4..5"), std::string::npos)
      << a.out;
  const auto reference = step_losses(a.out);
  for (const std::string schedule : {"--parallel.schedule=1f1b", "--parallel.schedule=interleaved --parallel.vpp=4",
                                     "--parallel.schedule=zb1"}) {
    const std::string copy = copy_of_step_2(saved, "schedule_resumed");
    const CliRun r = run(base + schedule + " --train.steps=4 --checkpoint.dir=" + copy + run_dir_flag(copy), kMpirun + "2",
                         120);
    expect_continues_like(r, reference, schedule);
    EXPECT_NE(r.out.find("resumed from " + copy + "/step_00000002"), std::string::npos) << r.out;
  }
}

TEST(Checkpoint, ContextParallelCheckpointsContinueAtOtherCp) {
  // Saved at cp 2 with ZeRO-1 (the optimizer state sharded over the two cp ranks),
  // continued at cp 1 and cp 4: each to the uninterrupted run's losses.
  const std::string base = "train --config configs/tiny.ini --model.n_layer=2 --train.global_batch=4 --log.every_steps=1 "
                           "--log.val_batches=0 --log.peak_gflops=100 ";
  const std::string saved = fresh_dir("cp2_saved");
  const CliRun a = run(base + "--parallel.cp=2 --parallel.zero=1 --train.steps=4 --checkpoint.every_steps=2 "
                              "--checkpoint.dir=" + saved + run_dir_flag(saved),
                       kMpirun + "2", 120);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.out.find("grid: dp=1 pp=1 cp=2 tp=1"), std::string::npos) << a.out;
  const auto reference = step_losses(a.out);
  for (const auto& [cp, ranks] : std::vector<std::pair<std::string, std::string>>{{"1", "1"}, {"4", "4"}}) {
    const std::string copy = copy_of_step_2(saved, "cp_resumed");
    const CliRun r = run(base + "--parallel.cp=" + cp + " --train.steps=4 --checkpoint.dir=" + copy + run_dir_flag(copy),
                         kMpirun + ranks, 120);
    expect_continues_like(r, reference, "cp " + cp);
    EXPECT_NE(r.out.find("resumed from " + copy + "/step_00000002"), std::string::npos) << r.out;
  }
}

TEST(Checkpoint, ExpertParallelCheckpointsContinueAtOtherEp) {
  // A mixture of 8 experts saved at ep 2 over dp 4 with ZeRO-1 (ranks 0 and 1 write their 4
  // experts each, their optimizer state sharded over the 2 ranks holding them), continued
  // with every expert on one rank, at ep 4 and at ep 2 over cp 4: each to the uninterrupted
  // run's losses, and to its expert biases (loss-free balancing's buffers: saved, loaded
  // under every layout, moved alike on every rank).
  // (A learning rate that moves the experts enough for a wrong gradient to show.)
  const std::string base = "train --config configs/tiny-mixtral.ini --model.n_layer=2 --model.seq_len=32 "
                           "--train.global_batch=8 --log.every_steps=1 --log.val_batches=0 --log.peak_gflops=100 "
                           "--train.warmup_steps=1 --train.lr=1e-2 --model.moe_router_score=sigmoid "
                           "--model.moe_router_bias_update_rate=0.01 ";
  const std::string saved = fresh_dir("ep2_saved");
  const CliRun a = run(base + "--parallel.ep=2 --parallel.zero=1 --train.steps=4 --checkpoint.every_steps=2 "
                              "--checkpoint.dir=" + saved + run_dir_flag(saved),
                       kMpirun + "4", 120);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.out.find("ep groups: {0,1} {2,3}"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("(1/1 of the split tensors, 4 of the 8 experts)"), std::string::npos) << a.out;
  const auto reference = step_losses(a.out);
  const auto biases = buffers_of(saved + "/step_00000004");
  ASSERT_EQ(biases.size(), 2u);
  for (const auto& [name, bias] : biases) {  // 4 steps of +-0.01 each: a multiple of 0.01 within 0.04, not all 0
    ASSERT_EQ(bias.size(), 8u) << name;
    EXPECT_TRUE(std::any_of(bias.begin(), bias.end(), [](float b) { return b != 0; })) << name;
    for (float b : bias) EXPECT_NEAR(b * 100, std::round(b * 100), 1e-4) << name;
  }
  // The run itself: every step at one rank's losses (each expert's gradient summed over
  // the ranks holding it, not over all of dp).
  const std::string alone = fresh_dir("ep_alone");
  const CliRun one = run(base + "--train.steps=4 " + run_dir_flag(alone), "", 120);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(reference.size(), 4u) << a.out;
  const auto alone_losses = step_losses(one.out);
  ASSERT_EQ(alone_losses.size(), 4u) << one.out;
  for (const auto& [step, loss] : alone_losses) EXPECT_NEAR(loss, reference.at(step), 2e-4) << "step " << step;
  for (const auto& [flags, ranks] : std::vector<std::pair<std::string, std::string>>{
           {"--parallel.ep=1", "1"}, {"--parallel.ep=4 --parallel.zero=1", "4"},
           // ep over the cp ranks alone (dp 1): the replica check compares each expert's two holders.
           {"--parallel.cp=4 --parallel.ep=2 --train.replica_check_steps=1", "4"}}) {
    const std::string copy = copy_of_step_2(saved, "ep_resumed");
    const CliRun r = run(base + flags + " --train.steps=4 --checkpoint.every_steps=2 --checkpoint.dir=" + copy +
                             run_dir_flag(copy),
                         kMpirun + ranks, 120);
    expect_continues_like(r, reference, flags);
    EXPECT_NE(r.out.find("resumed from " + copy + "/step_00000002"), std::string::npos) << r.out;
    EXPECT_EQ(buffers_of(copy + "/step_00000004"), biases) << flags;
    if (flags.find("cp=4") != std::string::npos) {
      EXPECT_NE(r.out.find("replica check: every 1 steps, the tensors held across each expert dp group, the buffers "
                           "across each cp group"),
                std::string::npos)
          << r.out;
    }
  }
}

// A resume cannot change the experts' shapes (the checkpoint's tensors have them): the
// setting is named with both values. It may change the routing: one line says what.
TEST(Checkpoint, AResumeNamesTheExpertSettingsItCannotChangeAndNotesTheRouting) {
  ModelConfig saved;
  saved.family = "mixtral";
  saved.n_kv_head = 2;
  saved.n_experts = 8;
  ModelConfig now = saved;
  EXPECT_EQ(check_resumed_experts(saved, now, "ck/step_00000002"), "");
  now.n_experts = 0;  // the family's default: 8 too
  EXPECT_EQ(check_resumed_experts(saved, now, "ck/step_00000002"), "");
  now.n_experts = 4;
  try {
    check_resumed_experts(saved, now, "ck/step_00000002");
    ADD_FAILURE() << "resumed with other experts";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).find("checkpoint ck/step_00000002 has model.n_experts=8, this run model.n_experts=4: "
                                         "the experts' tensors would not fit; resume with --model.n_experts=8"),
              0u)
        << e.what();
  }
  now = saved;
  now.n_experts_per_token = 1;
  now.moe_capacity_factor = 1.5;
  EXPECT_EQ(check_resumed_experts(saved, now, "ck/step_00000002"),
            "routing changed since the checkpoint: model.n_experts_per_token 2 -> 1, model.moe_capacity_factor 0 -> 1.5");
  ModelConfig dense;
  EXPECT_EQ(check_resumed_experts(dense, dense, "ck"), "");
  // Through a run: one rank, one step saved, resumed.
  const std::string dir = fresh_dir("moe_resume");
  const std::string base = "train --config configs/tiny-mixtral.ini --model.n_layer=1 --model.d_model=64 "
                           "--model.seq_len=32 --train.global_batch=2 --log.val_batches=0 --log.sample_every_steps=0 "
                           "--log.peak_gflops=100 --checkpoint.dir=" + dir + run_dir_flag(dir);
  ASSERT_EQ(run(base + "--train.steps=1 --checkpoint.every_steps=1").exit_code, 0);
  const CliRun other = run(base + "--train.steps=2 --model.n_experts=4");
  EXPECT_EQ(other.exit_code, 2) << other.err;
  EXPECT_NE(other.err.find("has model.n_experts=8, this run model.n_experts=4"), std::string::npos) << other.err;
  const CliRun routing = run(base + "--train.steps=2 --model.n_experts_per_token=1 --model.moe_capacity_factor=1.5");
  EXPECT_EQ(routing.exit_code, 0) << routing.err;
  EXPECT_NE(routing.out.find("routing changed since the checkpoint: model.n_experts_per_token 2 -> 1, "
                             "model.moe_capacity_factor 0 -> 1.5 (from step 2)\n"),
            std::string::npos)
      << routing.out;
  // Loss-free balancing switched on at a resume: the checkpoint has no expert bias, which
  // starts from its init (zeros), said once.
  fs::remove_all(dir + "/step_00000002");
  const CliRun bias = run(base + "--train.steps=2 --model.moe_router_bias_update_rate=0.01");
  EXPECT_EQ(bias.exit_code, 0) << bias.err;
  EXPECT_NE(bias.out.find("holds no model.layers.0.block_sparse_moe.gate.e_score_correction_bias (saved before it "
                          "was declared): 1 buffer starts from its init"),
            std::string::npos)
      << bias.out;
}

TEST(Checkpoint, AsyncWritesTheSameCheckpointsAndReportsTheStall) {
  const std::string sync_dir = fresh_dir("sync"), async_dir = fresh_dir("async");
  const CliRun s = run(kTrain + "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.dir=" + sync_dir + run_dir_flag(sync_dir));
  const CliRun a = run(kTrain + "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.async=true --checkpoint.dir=" +
                       async_dir + run_dir_flag(async_dir));
  ASSERT_EQ(s.exit_code, 0) << s.err;
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.out.find("training stalled"), std::string::npos) << a.out;
  expect_identical(sync_dir + "/step_00000004", async_dir + "/step_00000004");
  EXPECT_EQ(complete_checkpoints(async_dir).size(), 2u);
}

TEST(Checkpoint, CrashBetweenFilesKeepsThePreviousCheckpoint) {
  const std::string dir = fresh_dir("crash");
  const CliRun r = run(kTrain + "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.dir=" + dir + run_dir_flag(dir),
                       "env TRIDENT_TEST_ABORT_BEFORE_MANIFEST=4 " + kMpirun + "2 -x TRIDENT_TEST_ABORT_BEFORE_MANIFEST", 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(fs::exists(dir + "/step_00000004/node_0000.h5"));  // written, but never completed
  EXPECT_FALSE(fs::exists(dir + "/step_00000004/manifest.json"));
  const std::optional<Manifest> latest = find_latest_checkpoint(dir);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 2);
  const CliRun ls = run("ckpt ls --checkpoint.dir=" + dir);
  EXPECT_NE(ls.out.find("incomplete"), std::string::npos) << ls.out;
  const CliRun resumed = run(kTrain + "--train.steps=3 --checkpoint.dir=" + dir + run_dir_flag(dir));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from " + dir + "/step_00000002"), std::string::npos) << resumed.out;
}

TEST(Checkpoint, KilledWriterMidFileKeepsThePreviousCheckpoint) {
  const std::string dir = fresh_dir("killed");
  const CliRun r = run(kTrain + "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.async=true --checkpoint.dir=" +
                           dir + run_dir_flag(dir),
                       "env TRIDENT_TEST_KILL_DURING_WRITE=4 " + kMpirun + "2 -x TRIDENT_TEST_KILL_DURING_WRITE", 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(fs::exists(dir + "/step_00000004/node_0000.h5.tmp"));  // half written
  EXPECT_FALSE(fs::exists(dir + "/step_00000004/manifest.json"));
  EXPECT_EQ(find_latest_checkpoint(dir)->step, 2);
  const CliRun resumed = run(kTrain + "--train.steps=4 --checkpoint.dir=" + dir + run_dir_flag(dir), kMpirun + "2");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from " + dir + "/step_00000002"), std::string::npos) << resumed.out;
}

void flip_byte(const std::string& path, size_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.get(c);
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x5a));
}

TEST(Checkpoint, DamagedFilesAreNamedAndLatestFallsBack) {
  const std::string dir = fresh_dir("damaged");
  ASSERT_EQ(run(kTrain + "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.dir=" + dir + run_dir_flag(dir)).exit_code, 0);
  // A step never saved: said so, with the steps there are (not "incomplete").
  const CliRun never = run("ckpt export --checkpoint.dir=" + dir + " --step=7 --out=" + dir + "/x.h5");
  EXPECT_EQ(never.exit_code, 2);
  EXPECT_NE(never.err.find("no checkpoint of step 7 in '" + dir + "': its complete checkpoints are of steps 2, 4"),
            std::string::npos) << never.err;
  const std::string node = dir + "/step_00000004/node_0000.h5";
  const size_t size = fs::file_size(node);
  flip_byte(node, size / 2);
  // latest is damaged: fall back to step 2 and say so.
  const CliRun fallback = run(kTrain + "--train.steps=3 --checkpoint.dir=" + dir + run_dir_flag(dir));
  EXPECT_EQ(fallback.exit_code, 0) << fallback.err;
  EXPECT_NE(fallback.err.find("CRC-32"), std::string::npos) << fallback.err;
  EXPECT_NE(fallback.err.find("falling back"), std::string::npos) << fallback.err;
  EXPECT_NE(fallback.out.find("resumed from " + dir + "/step_00000002"), std::string::npos) << fallback.out;
  // Asked for by name: one clear error naming the file, exit 2.
  const CliRun named = run(kTrain + "--train.steps=5 --checkpoint.load=" + dir + "/step_00000004" + run_dir_flag(dir),
                           kMpirun + "2", 60);
  EXPECT_EQ(named.exit_code, 2) << named.err;
  EXPECT_EQ(count(named.err, "trident: error:"), 1) << named.err;
  EXPECT_NE(named.err.find("node_0000.h5 does not match its CRC-32"), std::string::npos) << named.err;
  // Truncated.
  fs::resize_file(node, size / 3);
  const CliRun truncated = run("ckpt inspect --checkpoint.dir=" + dir + " --step=4");
  EXPECT_EQ(truncated.exit_code, 2);
  EXPECT_NE(truncated.err.find("truncated"), std::string::npos) << truncated.err;
  // A manifest naming a file that is not there.
  fs::remove(node);
  const CliRun missing = run("ckpt export --checkpoint.dir=" + dir + " --step=4 --out=" + dir + "/x.h5");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("names node_0000.h5, which is missing"), std::string::npos) << missing.err;
  // Another model shape.
  const CliRun other = run(kTrain + "--model.d_model=64 --train.steps=3 --checkpoint.load=" + dir + "/step_00000002" +
                           run_dir_flag(dir));
  EXPECT_EQ(other.exit_code, 2);
  EXPECT_NE(other.err.find("holds a model gpt2 L4 H4 d128"), std::string::npos) << other.err;
}

TEST(Checkpoint, AFullDiskFailsTheSaveAndKeepsThePreviousOne) {
  const std::string dir = fresh_dir("full");
  ASSERT_EQ(run(kTrain + "--train.steps=2 --checkpoint.every_steps=2 --checkpoint.dir=" + dir + run_dir_flag(dir)).exit_code, 0);
  // Files of at most 6 MB: the next node file (about 10 MB) cannot be written.
  const CliRun r = run(kTrain + "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.dir=" + dir + run_dir_flag(dir),
                       "bash -c 'ulimit -f 6000; exec \"$@\"' --");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("saving the checkpoint of step 4 failed, the previous one is kept"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/step_00000004"));
  EXPECT_EQ(find_latest_checkpoint(dir)->step, 2);
}

TEST(Checkpoint, SignalSavesAndExitsZero) {
  const std::string dir = fresh_dir("signal");
  ChildProcess job(trident_bin() + " " + kTrain + "--train.steps=100000 --checkpoint.dir=" + dir + run_dir_flag(dir));
  // Signalled once training runs (its first step line), however slow the start is.
  ASSERT_TRUE(job.wait_for_output("\nstep ", 120));
  kill(job.pid(), SIGUSR1);
  ASSERT_TRUE(job.wait_for_exit(60));
  EXPECT_EQ(job.exit_code(), 0) << job.output();
  EXPECT_NE(job.output().find("on a signal, checkpoint saved"), std::string::npos) << job.output();
  const std::optional<Manifest> m = find_latest_checkpoint(dir);
  ASSERT_TRUE(m.has_value());
  EXPECT_GT(m->step, 0);
  EXPECT_LT(m->step, 100000);
}

// The first run gives checkpoint.dir alone: its last step is saved all the same (issue 55),
// once; the second's last step is also periodic (every_steps=1): saved once, not twice.
TEST(Checkpoint, ExportThenInitFrom) {
  const std::string dir = fresh_dir("export"), again = fresh_dir("export_again");
  const CliRun first = run(kTrain + "--train.steps=2 --checkpoint.dir=" + dir + run_dir_flag(dir));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(count(first.out, "checkpoint: step "), 1) << first.out;
  EXPECT_EQ(count(first.out, "checkpoint: step 2 saved to " + dir + "/step_00000002"), 1) << first.out;
  EXPECT_NE(first.out.find("next: "), std::string::npos) << first.out;
  const std::string file = dir + "/exported.h5";
  const CliRun e = run("ckpt export --checkpoint.dir=" + dir + " --out=" + file);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  // lr 0: the parameters pass through a step unchanged, so the new checkpoint holds
  // exactly what was exported.
  const CliRun r = run(kTrain + "--train.steps=1 --train.lr=0 --train.min_lr=0 --checkpoint.every_steps=1 "
                                "--checkpoint.init_from=" + file + " --checkpoint.dir=" + again + run_dir_flag(again));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("parameters initialized from"), std::string::npos);
  EXPECT_EQ(count(r.out, "checkpoint: step 1 saved"), 1) << r.out;
  const auto a = read_canonical(read_manifest(dir + "/step_00000002"), "params");
  const auto b = read_canonical(read_manifest(again + "/step_00000001"), "params");
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) EXPECT_EQ(a[i].second, b[i].second) << a[i].first;
}

// Llama the same way: the key/value heads shared by two ranks at tp 4 (2 heads), split
// at tp 2; saved under one layout, resumed bit-exactly under the same one and with the
// same losses under others, export and init_from, and neither family loads the other.
const std::string kLlama = "train --config configs/tiny-llama.ini --train.global_batch=8 --log.every_steps=1 "
                           "--log.val_batches=0 --log.peak_gflops=100 --train.micro_batch=2 ";

// Muon's state (momentum_buffer for the blocks' matrices, AdamW's moments for the rest)
// saved at tp 2 continues at tp 1 and at dp 2 with and without ZeRO-1: the same losses,
// and at step 4 the same momentum as the uninterrupted tp-2 run (a momentum lost on the
// way would be off by mu^2 of what steps 1 and 2 left).
TEST(Checkpoint, MuonStateSavedAtTpTwoContinuesUnderOtherLayouts) {
  const std::string muon = kLlama + "--model.n_layer=2 --train.optimizer=muon --train.warmup_steps=0 ";
  const std::string whole = fresh_dir("muon_whole");
  const CliRun a = run(muon + "--parallel.tp=2 --train.steps=4 --checkpoint.every_steps=2 --checkpoint.dir=" + whole +
                           run_dir_flag(whole), kMpirun + "2", 120);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const Manifest saved = read_manifest(whole + "/step_00000004");
  EXPECT_EQ(saved.optimizer, "muon");
  EXPECT_EQ(saved.optimizer_state, (std::vector<std::string>{"momentum_buffer", "exp_avg", "exp_avg_sq"}));
  const auto momentum = read_canonical(saved, "momentum_buffer");
  const auto reference = step_losses(a.out);
  for (const std::string layout : {"1 --parallel.dp=1", "2 --parallel.dp=2 --parallel.zero=1", "2 --parallel.dp=2"}) {
    const std::string copy = copy_of_step_2(whole, "muon_reshard");
    const CliRun r = run(muon + layout.substr(2) + " --train.steps=4 --checkpoint.every_steps=2 --checkpoint.dir=" +
                             copy + run_dir_flag(copy),
                         kMpirun + layout.substr(0, 1), 120);
    expect_continues_like(r, reference, layout);
    const auto resumed = read_canonical(read_manifest(copy + "/step_00000004"), "momentum_buffer");
    ASSERT_EQ(resumed.size(), momentum.size());
    int matrices = 0;
    for (size_t i = 0; i < momentum.size(); i++) {
      const auto& [name, want] = momentum[i];
      const std::vector<float>& got = resumed[i].second;
      ASSERT_EQ(resumed[i].first, name);
      ASSERT_EQ(got.size(), want.size()) << name;
      double diff = 0, norm = 0;
      for (size_t j = 0; j < want.size(); j++) {
        diff += (double(got[j]) - want[j]) * (double(got[j]) - want[j]);
        norm += double(want[j]) * want[j];
      }
      const bool matrix = name.find("_proj.weight") != std::string::npos;  // q/k/v/o, gate/up/down
      EXPECT_EQ(norm > 0, matrix) << name << ": a momentum for the matrices only";
      if (norm > 0) EXPECT_LT(std::sqrt(diff / norm), 1e-3) << layout << " " << name;
      matrices += matrix;
    }
    EXPECT_EQ(matrices, 2 * 7);
  }
}

TEST(Checkpoint, LlamaResumesExactlyAndReshards) {
  const std::string whole = fresh_dir("llama_whole"), halves = fresh_dir("llama_halves");
  const std::string tp4 = "--parallel.tp=4 ";
  const CliRun a = run(kLlama + tp4 + "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.dir=" + whole +
                           run_dir_flag(whole), kMpirun + "4", 120);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.out.find("each held by 2 ranks"), std::string::npos) << a.out;
  const CliRun b1 = run(kLlama + tp4 + "--train.steps=2 --checkpoint.every_steps=2 --checkpoint.dir=" + halves +
                            run_dir_flag(halves), kMpirun + "4", 120);
  ASSERT_EQ(b1.exit_code, 0) << b1.err;
  const CliRun b2 = run(kLlama + tp4 + "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.dir=" + halves +
                            run_dir_flag(halves), kMpirun + "4", 120);
  ASSERT_EQ(b2.exit_code, 0) << b2.err;
  EXPECT_NE(b2.out.find("resumed from " + halves + "/step_00000002"), std::string::npos) << b2.out;
  expect_identical(whole + "/step_00000004", halves + "/step_00000004");
  // The checkpoint of step 2 under other layouts: one rank, (dp, tp, pp) = (1, 2, 2),
  // dp 2 with ZeRO-1; each continues to the same losses as the tp-4 run did.
  const auto reference = step_losses(a.out);
  for (const std::string layout : {"1 --parallel.dp=1", "4 --parallel.tp=2 --parallel.pp=2",
                                   "2 --parallel.dp=2 --parallel.zero=1"}) {
    const std::string copy = copy_of_step_2(whole, "llama_reshard");
    const CliRun r = run(kLlama + layout.substr(2) + " --train.steps=4 --checkpoint.dir=" + copy + run_dir_flag(copy),
                         kMpirun + layout.substr(0, 1), 120);
    expect_continues_like(r, reference, layout);
  }
  // `ckpt inspect` keeps its columns under Llama's long names: every row's shape starts
  // where the header's does.
  const CliRun inspect = run("ckpt inspect --checkpoint.dir=" + whole + " --step=4");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  std::istringstream rows(inspect.out);
  size_t column = std::string::npos;
  int checked = 0;
  for (std::string row; std::getline(rows, row);) {
    if (row.rfind("tensor ", 0) == 0) column = row.find("shape");
    if (column == std::string::npos || row.rfind("model.", 0) != 0) continue;
    EXPECT_EQ(row[column - 1], ' ') << row;
    EXPECT_NE(row[column], ' ') << row;
    checked++;
  }
  EXPECT_GT(checked, 8) << inspect.out;
}

TEST(Checkpoint, LlamaExportInitFromAndTheOtherFamilyRefused) {
  const std::string llama = fresh_dir("llama_export"), again = fresh_dir("llama_again"), gpt2 = fresh_dir("gpt2_other");
  ASSERT_EQ(run(kLlama + "--train.steps=2 --checkpoint.every_steps=2 --checkpoint.dir=" + llama + run_dir_flag(llama))
                .exit_code, 0);
  const std::string file = llama + "/exported.h5";
  ASSERT_EQ(run("ckpt export --checkpoint.dir=" + llama + " --out=" + file).exit_code, 0);
  const CliRun r = run(kLlama + "--train.steps=1 --train.lr=0 --train.min_lr=0 --checkpoint.every_steps=1 --parallel.tp=2 "
                                "--checkpoint.init_from=" + file + " --checkpoint.dir=" + again + run_dir_flag(again),
                       kMpirun + "2", 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto a = read_canonical(read_manifest(llama + "/step_00000002"), "params");
  const auto b = read_canonical(read_manifest(again + "/step_00000001"), "params");
  ASSERT_EQ(a.size(), 4u * 9 + 3);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); i++) EXPECT_EQ(a[i].second, b[i].second) << a[i].first;
  // A GPT-2 config on the Llama checkpoint, and on its export; a Llama config on a GPT-2
  // checkpoint: one error naming model.family, exit 2, on every rank.
  ASSERT_EQ(run(kTrain + "--train.steps=1 --checkpoint.every_steps=1 --checkpoint.dir=" + gpt2 + run_dir_flag(gpt2)).exit_code, 0);
  for (const std::string& wrong : {kTrain + "--train.steps=3 --checkpoint.dir=" + llama,
                                   kTrain + "--train.steps=3 --checkpoint.init_from=" + file,
                                   kLlama + "--train.steps=3 --checkpoint.dir=" + gpt2}) {
    const CliRun w = run(wrong + run_dir_flag(fresh_dir("wrong")), kMpirun + "2", 120);
    EXPECT_EQ(w.exit_code, 2) << wrong << "\n" << w.err;
    EXPECT_EQ(count(w.err, "trident: error:"), 1) << wrong << "\n" << w.err;
    EXPECT_NE(w.err.find("model.family"), std::string::npos) << wrong << "\n" << w.err;
  }
}

// What every way of the pieces carries (ckpt/checkpoint_transport.h): a rank's pieces,
// packed as one message of packed_size's length, unpack with every attribute and float.
TEST(Checkpoint, PackedPiecesUnpackAsTheyWere) {
  const std::vector<float> a = {1.5f, -2.0f, 3.25f}, b = {7.0f};
  const std::vector<Piece> pieces = {{"params", "h.0.attn.qkv.w", "qkv_rows", {6, 4}, 8, 1, 2, a.data(), a.size()},
                                     {"exp_avg", "ln_f.g", "replicated", {4}, 4, 0, 1, b.data(), b.size()}};
  std::vector<char> blob;
  pack(pieces, blob);
  EXPECT_EQ(blob.size(), packed_size(pieces));
  const std::vector<Piece> back = unpack(blob);
  ASSERT_EQ(back.size(), pieces.size());
  for (size_t i = 0; i < pieces.size(); i++) {
    const Piece &p = pieces[i], &q = back[i];
    EXPECT_EQ(q.kind, p.kind);
    EXPECT_EQ(q.name, p.name);
    EXPECT_EQ(q.sharding, p.sharding);
    EXPECT_EQ(q.shape, p.shape);
    EXPECT_EQ(q.padded_rows, p.padded_rows);
    EXPECT_EQ(q.tp_rank, p.tp_rank);
    EXPECT_EQ(q.tp_size, p.tp_size);
    ASSERT_EQ(q.count, p.count);
    EXPECT_EQ(std::memcmp(q.data, p.data, p.count * sizeof(float)), 0) << p.name;
  }
}

}  // namespace
}  // namespace trident
