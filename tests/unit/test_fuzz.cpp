// A bounded fuzz driver for the readers of files that come from outside (issue 17): INI
// configs and flags, a checkpoint's manifest.json and node files, safetensors weights,
// Megatron indexed datasets, llm.c token shards and the HDF5 reference files. Each valid
// input is mutated at random from a fixed seed (bytes flipped, the file cut short, a range
// overwritten, a chunk repeated) and read the way a run reads it: the reader accepts it or
// throws one UsageError (what main turns into `trident: error:`, exit 2), never another
// exception, a crash, a hang or, under `make DEBUG=1` (AddressSanitizer and UBSan), a read
// out of bounds.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "cli_helpers.h"
#include "config/config.h"
#include "data/indexed_dataset.h"
#include "data/token_dataset.h"
#include "kernels/base/error.h"
#include "train/verify.h"

namespace fs = std::filesystem;

namespace trident {
namespace {

constexpr uint32_t kSeed = 17;
constexpr int kMutationsPerInput = 120;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// One random damage of `bytes`: flips, a cut, an overwritten range, a repeated chunk.
std::string mutate(std::string bytes, std::mt19937& rng) {
  if (bytes.empty()) return bytes;
  const auto at = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  switch (rng() % 4) {
    case 0:
      for (int i = 0, n = 1 + static_cast<int>(rng() % 8); i < n; i++) bytes[at(bytes.size())] ^= static_cast<char>(1 + rng() % 255);
      break;
    case 1:
      bytes.resize(at(bytes.size()));
      break;
    case 2: {
      const size_t begin = at(bytes.size()), n = std::min<size_t>(bytes.size() - begin, 1 + rng() % 64);
      for (size_t i = 0; i < n; i++) bytes[begin + i] = static_cast<char>(rng());
      break;
    }
    default: {
      const size_t begin = at(bytes.size()), n = std::min<size_t>(bytes.size() - begin, 1 + rng() % 256);
      bytes.insert(at(bytes.size()), bytes.substr(begin, n));
    }
  }
  return bytes;
}

// Reads every mutation of the file at `path` with `read`; counts what it accepted.
// Anything but success or a UsageError fails the test, naming the mutation. Unless
// `refusals` is false (a reader that recovers), some mutation must be refused.
void fuzz_file(const std::string& what, const std::string& path, const std::function<void()>& read,
               bool refusals = true) {
  const std::string valid = read_bytes(path);
  ASSERT_FALSE(valid.empty()) << path;
  ASSERT_NO_THROW(read()) << what << ": the valid input must read";
  std::mt19937 rng(kSeed);
  int accepted = 0, refused = 0;
  for (int i = 0; i < kMutationsPerInput; i++) {
    write_bytes(path, mutate(valid, rng));
    try {
      read();
      accepted++;
    } catch (const UsageError&) {
      refused++;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ", mutation " << i << " (seed " << kSeed << "): not a UsageError: " << e.what();
    }
  }
  write_bytes(path, valid);
  std::printf("fuzz %-28s %d mutations: %d refused with one error, %d read\n", what.c_str(), kMutationsPerInput,
              refused, accepted);
  if (refusals) {
    EXPECT_GT(refused, 0) << what << ": no mutation was noticed";
  }
}

TEST(Fuzz, ConfigFilesAndFlags) {
  const std::string path = testing::TempDir() + "fuzz.ini";
  write_bytes(path, read_bytes("configs/tiny-llama.ini"));
  fuzz_file("INI config", path, [&] {
    Config c = parse_command_line("train", {"--config", path}).config;
    c.validate();
  });
  // Flags: the tiny config's keys with damaged names and values.
  std::mt19937 rng(kSeed);
  const std::vector<std::string> flags = {"--model.d_model=128", "--train.steps=10", "--parallel.zero=3",
                                          "--train.recompute=selective", "--data.val_fraction=0.1"};
  int refused = 0;
  for (int i = 0; i < kMutationsPerInput; i++) {
    const std::string flag = mutate(flags[rng() % flags.size()], rng);
    try {
      Config c = parse_command_line("train", {flag}).config;
      c.validate();
    } catch (const UsageError&) {
      refused++;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "flag '" << flag << "': not a UsageError: " << e.what();
    }
  }
  EXPECT_GT(refused, 0);
}

TEST(Fuzz, CheckpointManifestAndNodeFiles) {
  const std::string dir = testing::TempDir() + "fuzz_ckpt";
  fs::remove_all(dir);
  const CliRun r = run("train --config configs/tiny.ini --model.n_layer=1 --train.steps=1 --checkpoint.every_steps=1 "
                       "--log.peak_gflops=1 --log.val_batches=0 --checkpoint.dir=" + dir + " --log.run_dir=" + dir + "_run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string step = dir + "/step_00000001";
  const auto load = [&] {
    const Manifest m = read_manifest(step);
    for (const char* kind : {"params", "exp_avg", "exp_avg_sq"}) read_canonical(m, kind);
  };
  fuzz_file("manifest.json", step + "/manifest.json", load);
  fuzz_file("checkpoint node file", step + "/node_0000.h5", load);
  // A damaged `latest` is no error: the newest complete step directory is found instead.
  fuzz_file("latest", dir + "/latest", [&] {
    const std::optional<Manifest> m = find_latest_checkpoint(dir, /*quiet=*/true);
    if (!m || m->step != 1) throw std::logic_error("a damaged latest lost the checkpoint");
  }, /*refusals=*/false);
}

TEST(Fuzz, SafetensorsWeights) {
  const std::string path = testing::TempDir() + "fuzz.safetensors";
  const std::vector<float> a(48, 0.5f), b(10, -2.0f);
  write_safetensors(path, {{"model.a.weight", {6, 8}, a.data()}, {"model.b.bias", {10}, b.data()}}, "BF16",
                    {{"format", "pt"}});
  fuzz_file("safetensors", path, [&] {
    const SafetensorsFile f(path);
    for (const SafetensorsTensor& t : f.tensors()) {
      std::vector<float> out(static_cast<size_t>(t.numel()));
      f.read(t, 0, t.numel(), out.data());
    }
  });
}

TEST(Fuzz, MegatronIndexedDatasetsAndLlmcShards) {
  const std::string prefix = testing::TempDir() + "fuzz_megatron";
  {
    IndexedDatasetWriter w(prefix, TokenType::uint16);
    for (int d = 0; d < 6; d++) {
      std::vector<int32_t> doc(20 + 7 * d);
      for (size_t i = 0; i < doc.size(); i++) doc[i] = static_cast<int32_t>((i * 31 + d) % 1000);
      w.add_document(doc);
    }
    w.finish();
  }
  const auto read_all = [](const TokenDataset& d) {
    std::vector<int32_t> tokens(d.tokens());
    d.read(0, tokens.size(), tokens.data());
    d.max_token();
  };
  fuzz_file("Megatron .idx", prefix + ".idx", [&] { read_all(*open_megatron_dataset(prefix)); });
  fuzz_file("Megatron .bin", prefix + ".bin", [&] { read_all(*open_megatron_dataset(prefix)); });

  // llm.c: 256 int32 of header (magic, version, token count), then uint16 tokens.
  const std::string shard = testing::TempDir() + "fuzz_llmc_train_000001.bin";
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520, header[1] = 1, header[2] = 300;
  std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  for (int i = 0; i < 300; i++) {
    const uint16_t t = static_cast<uint16_t>((i * 17) % 50257);
    bytes.append(reinterpret_cast<const char*>(&t), 2);
  }
  write_bytes(shard, bytes);
  fuzz_file("llm.c shard", shard, [&] { read_all(*open_llmc_shards({shard})); });
}

TEST(Fuzz, ReferenceFiles) {
  const std::string path = testing::TempDir() + "fuzz_ref.h5";
  fs::copy_file("tests/data/gpt2_ref_a.h5", path, fs::copy_options::overwrite_existing);
  fuzz_file("HDF5 reference", path, [&] { load_reference(path); });
}

}  // namespace
}  // namespace trident
