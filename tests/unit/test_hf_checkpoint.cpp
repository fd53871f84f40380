// Hugging Face weights in and out: the safetensors format byte-exact (the reference
// implementation's golden vector), its parser against damaged and hostile files (a
// bounded fuzz), and the whole flow as a user runs it: train, export to HF, check the
// files with HF's conventions in Python (tests/hf/hf_reference.py: logits of a GPT-2 and a
// Llama computed from the export), import under another layout bit-exactly, import what
// the Python side wrote, and one clear error for a config.json that does not fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "ckpt/checkpoint.h"
#include "ckpt/hf_checkpoint.h"
#include "ckpt/safetensors.h"
#include "model/hf_conventions.h"
#include "cli_helpers.h"
#include "kernels/base/error.h"

namespace fs = std::filesystem;

namespace trident {
namespace {


std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void put(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// huggingface/safetensors tensor.rs test_serialization: one F32 tensor attn.0 [1,2,3] = 0..5.
TEST(Safetensors, GoldenVectorOfTheReferenceWriter) {
  const std::string path = testing::TempDir() + "golden.safetensors";
  const float values[6] = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(write_safetensors(path, {{"attn.0", {1, 2, 3}, values}}, "F32", {}), 24u);
  const std::string b = bytes_of(path);
  ASSERT_EQ(b.size(), 96u);
  EXPECT_EQ(b.substr(0, 8), std::string("\x40\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(b.substr(8, 64), R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})");
  EXPECT_EQ(b.substr(72), std::string(reinterpret_cast<const char*>(values), 24));
  SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), 1u);
  float back[6];
  f.read(*f.find("attn.0"), 0, 6, back);
  for (int i = 0; i < 6; i++) EXPECT_EQ(back[i], values[i]);
  f.read(*f.find("attn.0"), 1, 2, back, 3);  // a strided column: elements 1 and 4
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 4.0f);
}

TEST(Safetensors, Bf16AndF16ReadAsFloats) {
  const std::string path = testing::TempDir() + "bf16.safetensors";
  const float values[4] = {1.0f, -2.5f, 3.0e-3f, 65504.0f};
  write_safetensors(path, {{"w", {4}, values}}, "BF16", {{"format", "pt"}});
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  float back[4];
  f.read(f.tensors()[0], 0, 4, back);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
  EXPECT_NEAR(back[2], 3.0e-3f, 3.0e-3f / 128);
  // F16, hand-written: 1.0 (0x3c00), -2 (0xc000), the smallest subnormal (0x0001), 65504 (0x7bff).
  const std::string header = R"({"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})";
  std::string file(8, '\0');
  file[0] = static_cast<char>(header.size());
  file += header + std::string("\x00\x3c\x00\xc0\x01\x00\xff\x7b", 8);
  put(path, file);
  SafetensorsFile h(path);
  h.read(h.tensors()[0], 0, 4, back);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.0f);
  EXPECT_EQ(back[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(back[3], 65504.0f);
}

// A header and a buffer, as a file.
std::string file_with(const std::string& header, size_t buffer) {
  std::string f(8, '\0');
  for (int i = 0; i < 8; i++) f[i] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  return f + header + std::string(buffer, '\x11');
}

TEST(Safetensors, EveryViolationIsOneClearError) {
  const std::string path = testing::TempDir() + "bad.safetensors";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("\x01\x02", 2), "shorter than its 8-byte header length"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "above the limit"},
      {std::string("\x10\0\0\0\0\0\0\0", 8) + "{}", "runs past the end of the file"},
      {file_with("[1,2]", 0), "does not start with '{'"},
      {file_with("{\"a\":", 0), "not JSON"},
      {file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16), "appears twice"},
      {file_with(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8), "unknown dtype 'F33'"},
      {file_with(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "not a non-negative integer"},
      {file_with(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "need 12 bytes, data_offsets hold 8"},
      {file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})", 8), "run past the data buffer"},
      {file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "end before they begin"},
      {file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "a hole before it"},
      {file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "overlaps"},
      {file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12), "cover 8 of the data buffer's 12 bytes"},
      {file_with(R"({"__metadata__":{"format":1}})", 0), "is not a string"},
      {file_with(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8), "shape too large"},
      {file_with(R"({"a":7})", 0), "expected an object with dtype, shape and data_offsets"},
      {file_with(R"({"a":{"dtype":"F32","shape":[[[[2]]]],"data_offsets":[0,8]}})", 8), "nests deeper"},
      {file_with(R"({"a":{"dtype":"F32","shape":[9223372036854775808,0],"data_offsets":[0,0]}})", 0), "shape too large"},
  };
  for (const auto& [bytes, expected] : cases) {
    put(path, bytes);
    try {
      SafetensorsFile f(path);
      ADD_FAILURE() << "accepted: " << expected;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what() << "\nexpected: " << expected;
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

// Bounded fuzz: every truncation of a valid file, and random byte flips (seed printed),
// either load (and then every tensor reads) or are one UsageError; never anything else.
TEST(Safetensors, FuzzedFilesNeverCrash) {
  const std::string good = testing::TempDir() + "good.safetensors", path = testing::TempDir() + "fuzz.safetensors";
  std::vector<float> a(6, 1.5f), b(4, -2.0f), c(1, 3.0f);
  write_safetensors(good, {{"a", {2, 3}, a.data()}, {"b.weight", {4}, b.data()}, {"c", {}, c.data()}}, "F32",
                    {{"format", "pt"}});
  const std::string original = bytes_of(good);
  int loaded = 0, rejected = 0;
  const auto attempt = [&](const std::string& bytes) {
    put(path, bytes);
    try {
      SafetensorsFile f(path);
      std::vector<float> out;
      for (const SafetensorsTensor& t : f.tensors()) {
        out.resize(static_cast<size_t>(t.numel()));
        try {
          f.read(t, 0, t.numel(), out.data());
        } catch (const UsageError&) {  // a flipped dtype the reader does not convert
        }
      }
      loaded++;
    } catch (const UsageError&) {
      rejected++;
    }
  };
  for (size_t n = 0; n < original.size(); n++) attempt(original.substr(0, n));
  const unsigned seed = 20261201;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 3000; trial++) {
    std::string bytes = original;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; f++) bytes[rng() % bytes.size()] = static_cast<char>(rng() & 0xff);
    attempt(bytes);
  }
  std::printf("fuzz (seed %u): %d loaded, %d rejected with one error\n", seed, loaded, rejected);
  EXPECT_EQ(loaded + rejected, static_cast<int>(original.size()) + 3000);
  EXPECT_GE(rejected, static_cast<int>(original.size()));  // every truncation is rejected
}

bool have_python_numpy() { return std::system((kPython + " -c 'import numpy' 2>/dev/null").c_str()) == 0; }

struct Flow {
  std::string dir, config;
  // Where import_and_export loads it: 4 ranks as tp 2 x pp 2, or a mixture of experts'
  // as tp 2 x dp 2 with its experts split over the two dp ranks (ep 2).
  std::string layout = "--parallel.tp=2 --parallel.pp=2";
};

// Trains 3 steps, exports to HF, and returns the folder names.
std::string train_and_export(const Flow& f, const std::string& extra = "") {
  const CliRun t = run("train --config " + f.config + " --train.steps=3 --checkpoint.every_steps=3 --log.val_batches=0 "
                       "--checkpoint.dir=" + f.dir + "/ck --log.run_dir=" + f.dir + "/run");
  EXPECT_EQ(t.exit_code, 0) << t.out << t.err;
  const CliRun e = run("ckpt export --checkpoint.dir=" + f.dir + "/ck --format=hf --out=" + f.dir + "/hf" + extra);
  EXPECT_EQ(e.exit_code, 0) << e.out << e.err;
  return f.dir + "/hf";
}

// Imports `from` under f.layout without changing it (one step at learning rate 0) and
// exports the result to `to`.
void import_and_export(const Flow& f, const std::string& from, const std::string& to, const std::string& extra = "") {
  fs::remove_all(f.dir + "/ck_in");
  const CliRun t = run("train --config " + f.config + " " + f.layout + " --train.global_batch=4 "
                       "--train.micro_batch=2 --train.steps=1 --train.lr=0 --train.min_lr=0 --log.val_batches=0 "
                       "--checkpoint.init_from=" + from + " --checkpoint.dir=" + f.dir + "/ck_in "
                       "--checkpoint.every_steps=1 --log.run_dir=" + f.dir + "/run_in",
                       kMpirun + "4", 180);
  ASSERT_EQ(t.exit_code, 0) << t.out << t.err;
  EXPECT_NE(t.out.find("parameters initialized from " + from + " (Hugging Face: "), std::string::npos) << t.out;
  const CliRun e = run("ckpt export --checkpoint.dir=" + f.dir + "/ck_in --format=hf --out=" + to + extra);
  ASSERT_EQ(e.exit_code, 0) << e.out << e.err;
}

class HfFlow : public testing::TestWithParam<std::string> {};

// GetParam(): a config, or a Llama-style family on tiny-llama's shape (Mistral with a
// window of 16 of its 128 tokens), or a mixture of experts on tiny-mixtral's (Mixtral with
// the window too; Qwen3-MoE's experts 64 wide, not renormalized), imported with its experts
// split over ranks.
Flow flow_of(const std::string& name) {
  const bool config = name == "tiny" || name == "tiny-llama";
  const std::string dir = testing::TempDir() + "hf_" + name;
  const std::string experts = "--parallel.tp=2 --parallel.ep=2";
  if (name == "mixtral") return {dir, "configs/tiny-mixtral.ini --model.sliding_window=16", experts};
  if (name == "qwen3_moe")
    return {dir, "configs/tiny-mixtral.ini --model.family=qwen3_moe --model.moe_ffn_dim=64 --model.moe_norm_topk=false",
            experts};
  // Qwen3 as its small models are: heads of their own width (48, not 128 / 4), the head tied.
  return {dir, config ? "configs/" + name + ".ini"
                      : "configs/tiny-llama.ini --model.family=" + name +
                            (name == "mistral" ? " --model.sliding_window=16" : "") +
                            (name == "qwen3" ? " --model.head_dim=48 --model.tie_word_embeddings=true" : "")};
}

TEST_P(HfFlow, ExportIsWhatHuggingFaceComputesAndImportIsBitExact) {
  const Flow f = flow_of(GetParam());
  fs::remove_all(f.dir);
  const std::string hf = train_and_export(f, " --max_shard_gb=0.001");  // several shards and an index
  ASSERT_TRUE(fs::exists(hf + "/model.safetensors.index.json"));
  const nlohmann::json config = nlohmann::json::parse(bytes_of(hf + "/config.json"));
  EXPECT_EQ(config["model_type"], GetParam() == "tiny" ? "gpt2" : GetParam() == "tiny-llama" ? "llama" : GetParam());
  if (GetParam() == "mistral" || GetParam() == "mixtral") {
    EXPECT_EQ(config["sliding_window"], 16);
  }
  if (GetParam() == "qwen3") {
    EXPECT_EQ(config["head_dim"], 48);
    EXPECT_EQ(config["tie_word_embeddings"], true);
    EXPECT_EQ(bytes_of(hf + "/model.safetensors.index.json").find("lm_head"), std::string::npos);
  }
  if (GetParam() == "mixtral") {
    EXPECT_EQ(config["num_local_experts"], 8);
    EXPECT_EQ(config["num_experts_per_tok"], 2);
  }
  if (GetParam() == "qwen3_moe") {
    EXPECT_EQ(config["num_experts"], 8);
    EXPECT_EQ(config["moe_intermediate_size"], 64);
    EXPECT_EQ(config["norm_topk_prob"], false);
  }

  // Under another layout and back: the same files, byte for byte.
  import_and_export(f, hf, f.dir + "/hf_again", " --max_shard_gb=0.001");
  for (const auto& e : fs::directory_iterator(hf))
    EXPECT_EQ(bytes_of(e.path().string()), bytes_of(f.dir + "/hf_again/" + e.path().filename().string()))
        << e.path().filename();

  if (!have_python_numpy()) GTEST_SKIP() << "no python3-numpy: the Hugging Face side is not checked";
  // HF's conventions, in float64, against trident's logits of the same checkpoint.
  const CliRun g = run("generate --checkpoint.load=" + f.dir + "/ck/step_00000003 --prompt 'The quick brown fox' "
                       "--max_tokens=1 --dump_logits=" + f.dir + "/logits.json");
  ASSERT_EQ(g.exit_code, 0) << g.out << g.err;
  const std::string check = kPython + " tests/hf/hf_reference.py logits " + hf + " " + f.dir + "/logits.json > " + f.dir +
                            "/logits.txt 2>&1";
  EXPECT_EQ(std::system(check.c_str()), 0) << slurp(f.dir + "/logits.txt");
  EXPECT_NE(slurp(f.dir + "/logits.txt").find("max relative error"), std::string::npos);

  // What the Python side writes in HF's layout (GPT-2: prefixed names, buffers, the tied
  // head stored) is imported exactly.
  const std::string write = kPython + " tests/hf/hf_reference.py write " + hf + " " + f.dir + "/py 7 > " + f.dir +
                            "/write.txt 2>&1";
  ASSERT_EQ(std::system(write.c_str()), 0) << slurp(f.dir + "/write.txt");
  import_and_export(f, f.dir + "/py", f.dir + "/py_back");
  const std::string compare = kPython + " tests/hf/hf_reference.py compare " + f.dir + "/py " + f.dir + "/py_back > " +
                              f.dir + "/compare.txt 2>&1";
  EXPECT_EQ(std::system(compare.c_str()), 0) << slurp(f.dir + "/compare.txt");
}

INSTANTIATE_TEST_SUITE_P(Families, HfFlow, testing::Values("tiny", "tiny-llama", "qwen2", "qwen3", "mistral", "mixtral",
                                                                   "qwen3_moe", "olmo2"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(HfConventions, RopeScalingIsComparedFieldByField) {
  ModelConfig m;
  m.family = "llama";
  m.rope_scaling.type = "llama3";
  const TransformerSpec spec = transformer_spec(m);
  nlohmann::json config = hf_config(spec, "float32");
  EXPECT_TRUE(hf_config_mismatches(config, spec).empty());
  config["rope_scaling"]["factor"] = 32;
  const std::vector<std::string> bad = hf_config_mismatches(config, spec);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0], "rope_scaling.factor = 32, but model.rope_factor = 8");
  config["rope_scaling"] = nullptr;
  EXPECT_EQ(hf_config_mismatches(config, spec).at(0), "rope_scaling = null, but model.rope_scaling = llama3");
}

// The manifest keeps every field of the model (it kept only rope_scaling's type, so the
// export of a run with other llama3 factors wrote the defaults): a model written into a
// manifest and read back exports the factors it was trained with.
TEST(HfConventions, TheManifestKeepsRopeScalingForTheExport) {
  ModelConfig m;
  m.family = "llama";
  m.n_kv_head = 2;
  m.ffn_dim = 352;
  m.rope_theta = 500000;
  m.rope_scaling = {"llama3", 32, 2, 8, 4096};
  const nlohmann::json manifest = {{"format", "trident-checkpoint-v1"},
                                   {"step", 5},
                                   {"model", model_json(m)},
                                   {"layout", {{"dp", 1}, {"tp", 1}, {"pp", 1}, {"zero", 0}, {"nodes", 1}}},
                                   {"files", nlohmann::json::array()}};
  const ModelConfig read = parse_manifest(manifest.dump(), "step_00000005", "manifest.json").model;
  EXPECT_EQ(model_json(read), model_json(m));
  const nlohmann::json exported = hf_config(transformer_spec(read), "float32");
  EXPECT_EQ(exported["rope_theta"], 500000);
  EXPECT_EQ(exported["rope_scaling"]["factor"], 32);
  EXPECT_EQ(exported["rope_scaling"]["low_freq_factor"], 2);
  EXPECT_EQ(exported["rope_scaling"]["high_freq_factor"], 8);
  EXPECT_EQ(exported["rope_scaling"]["original_max_position_embeddings"], 4096);
  // An older manifest (no factors) reads with the defaults.
  nlohmann::json older = manifest;
  older["model"].erase("rope_factor");
  EXPECT_EQ(parse_manifest(older.dump(), "step_00000005", "manifest.json").model.rope_scaling.factor, 8);
}

// Hugging Face's mixtures route with softmax: a sigmoid-routed checkpoint has no HF form,
// one clear error (exit 2 from the command) before any file is read or written.
TEST(HfConventions, ASigmoidRouterIsNotExported) {
  ModelConfig m;
  m.family = "mixtral";
  m.n_kv_head = 2;
  m.n_experts = 4;
  m.moe_router_score = "sigmoid";
  const nlohmann::json manifest = {{"format", "trident-checkpoint-v1"},
                                   {"step", 5},
                                   {"model", model_json(m)},
                                   {"layout", {{"dp", 1}, {"tp", 1}, {"pp", 1}, {"zero", 0}, {"nodes", 1}}},
                                   {"files", nlohmann::json::array()}};
  const Manifest read = parse_manifest(manifest.dump(), "step_00000005", "manifest.json");
  EXPECT_EQ(read.model.moe_router_score, "sigmoid");
  const std::string out = testing::TempDir() + "hf_sigmoid";
  fs::remove_all(out);
  try {
    export_hf(read, out, HfExportOptions{});
    ADD_FAILURE() << "exported";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("router scores with sigmoid (model.moe_router_score): Hugging Face's mixtral "
                                         "routes with softmax"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
}

// An export warns where Hugging Face's model will behave otherwise than the trained one: a
// capacity factor's dropped tokens (HF's Mixtral is dropless), byte-level tokens (no HF
// tokenizer goes with the weights). A dropless run on a real tokenizer: no warning.
TEST(HfConventions, AnExportNamesWhereHuggingFaceBehavesOtherwise) {
  ModelConfig m;
  m.family = "mixtral";
  m.n_kv_head = 2;
  m.n_experts = 4;
  m.moe_capacity_factor = 1.25;
  const auto manifest_of = [](const ModelConfig& model, const std::string& config_ini) {
    const nlohmann::json j = {{"format", "trident-checkpoint-v1"},
                              {"step", 5},
                              {"model", model_json(model)},
                              {"config", config_ini},
                              {"layout", {{"dp", 1}, {"tp", 1}, {"pp", 1}, {"zero", 0}, {"nodes", 1}}},
                              {"files", nlohmann::json::array()}};
    return parse_manifest(j.dump(), "step_00000005", "manifest.json");
  };
  const std::vector<std::string> both = hf_export_caveats(manifest_of(m, "[data]\ntokenizer = byte\n"));
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].find("this checkpoint trained with model.moe_capacity_factor=1.25 (tokens over an expert's capacity "
                         "dropped); Hugging Face's mixtral is dropless"),
            0u)
      << both[0];
  EXPECT_EQ(both[1].find("this checkpoint trained on byte-level tokens (data.tokenizer=byte), which have no Hugging Face "
                         "tokenizer"),
            0u)
      << both[1];
  m.moe_capacity_factor = 0;
  EXPECT_TRUE(hf_export_caveats(manifest_of(m, "[data]\ntokenizer = gpt2\ntokenizer_path = gpt2-files\n")).empty());
}

TEST(HfCheckpoint, Bf16ExportRoundsAndImportsWithinBf16) {
  const Flow f{testing::TempDir() + "hf_bf16", "configs/tiny-llama.ini"};
  fs::remove_all(f.dir);
  train_and_export(f, " --max_shard_gb=0.001");  // an earlier, sharded export in the same folder
  const std::string hf = f.dir + "/hf";
  const CliRun e = run("ckpt export --checkpoint.dir=" + f.dir + "/ck --format=hf --out=" + hf + " --dtype=bf16");
  ASSERT_EQ(e.exit_code, 0) << e.out << e.err;
  for (const auto& entry : fs::directory_iterator(hf))  // its shards and index are gone
    EXPECT_EQ(entry.path().filename().string().find("model-"), std::string::npos) << entry.path();
  EXPECT_FALSE(fs::exists(hf + "/model.safetensors.index.json"));
  SafetensorsFile file(hf + "/model.safetensors");
  for (const SafetensorsTensor& t : file.tensors()) EXPECT_EQ(t.dtype, "BF16") << t.name;
  EXPECT_EQ(nlohmann::json::parse(bytes_of(hf + "/config.json"))["torch_dtype"], "bfloat16");
  import_and_export(f, hf, f.dir + "/again", " --dtype=bf16");  // bf16 -> fp32 -> bf16: exact
  EXPECT_EQ(bytes_of(hf + "/model.safetensors"), bytes_of(f.dir + "/again/model.safetensors"));
}

// A run on SentencePiece tokens: its tokenizer.model travels with the weights.
TEST(HfCheckpoint, TheRunsTokenizerIsExportedBesideTheWeights) {
  const std::string dir = testing::TempDir() + "hf_tokenizer";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const CliRun p = run("prepare --input /usr/share/games/fortunes --out " + dir + "/fortunes "
                       "--data.tokenizer=sentencepiece --train_tokenizer=512", "", 300);
  ASSERT_EQ(p.exit_code, 0) << p.out << p.err;
  const Flow f{dir, "configs/tiny-llama.ini --model.vocab_size=512 --data.path=" + dir +
                        "/fortunes --data.tokenizer=sentencepiece --data.tokenizer_path=" + dir + "/fortunes.model"};
  const std::string hf = train_and_export(f);
  EXPECT_EQ(bytes_of(hf + "/tokenizer.model"), bytes_of(dir + "/fortunes.model"));
  const nlohmann::json config = nlohmann::json::parse(bytes_of(hf + "/config.json"));
  EXPECT_EQ(config["vocab_size"], 512);
  // The tokenizer's own special ids (Llama 2's SentencePiece settings: <unk> 0, <s> 1,
  // </s> 2), and the files AutoTokenizer and generate() read, as transformers writes them.
  EXPECT_EQ(config["bos_token_id"], 1);
  EXPECT_EQ(config["eos_token_id"], 2);
  const nlohmann::json generation = nlohmann::json::parse(bytes_of(hf + "/generation_config.json"));
  EXPECT_EQ(generation["bos_token_id"], 1);
  EXPECT_EQ(generation["eos_token_id"], 2);
  const nlohmann::json tokenizer = nlohmann::json::parse(bytes_of(hf + "/tokenizer_config.json"));
  EXPECT_EQ(tokenizer["tokenizer_class"], "LlamaTokenizer");
  EXPECT_EQ(tokenizer["bos_token"], "<s>");
  EXPECT_EQ(tokenizer["eos_token"], "</s>");
  EXPECT_EQ(tokenizer["model_max_length"], 128);
}

TEST(HfCheckpoint, AConfigThatDoesNotFitIsOneErrorNamingTheField) {
  const Flow f{testing::TempDir() + "hf_bad", "configs/tiny-llama.ini"};
  fs::remove_all(f.dir);
  const std::string hf = train_and_export(f);
  const std::string base = "train --config configs/tiny-llama.ini --train.steps=1 --log.val_batches=0 --log.run_dir=" +
                           f.dir + "/run_bad --checkpoint.init_from=";
  const CliRun layers = run(base + hf + " --model.n_layer=3");
  EXPECT_EQ(layers.exit_code, 2) << layers.err;
  EXPECT_EQ(count(layers.err, "trident: error:"), 1) << layers.err;
  EXPECT_NE(layers.err.find("num_hidden_layers = 4, but model.n_layer = 3"), std::string::npos) << layers.err;
  const CliRun family = run("train --config configs/tiny.ini --train.steps=1 --log.val_batches=0 --log.run_dir=" + f.dir +
                            "/run_bad --checkpoint.init_from=" + hf, kMpirun + "2");
  EXPECT_EQ(family.exit_code, 2) << family.err;
  EXPECT_EQ(count(family.err, "trident: error:"), 1) << family.err;
  EXPECT_NE(family.err.find("model_type = 'llama', but model.family = gpt2"), std::string::npos) << family.err;
  // Without config.json the tensors speak: a missing one is named.
  fs::remove(hf + "/config.json");
  const CliRun shape = run(base + hf + "/model.safetensors --model.ffn_dim=256");
  EXPECT_EQ(shape.exit_code, 2) << shape.err;
  EXPECT_NE(shape.err.find("gate_proj.weight has shape [352, 128], the configured model needs [256, 128]"),
            std::string::npos) << shape.err;
  // A truncated file: one error that says so.
  const std::string whole = bytes_of(hf + "/model.safetensors");
  put(hf + "/model.safetensors", whole.substr(0, whole.size() / 2));
  const CliRun cut = run(base + hf + "/model.safetensors");
  EXPECT_EQ(cut.exit_code, 2) << cut.err;
  EXPECT_EQ(count(cut.err, "trident: error:"), 1) << cut.err;
  EXPECT_NE(cut.err.find("truncated?"), std::string::npos) << cut.err;
}

}  // namespace
}  // namespace trident
