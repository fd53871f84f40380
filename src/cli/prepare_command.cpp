#include "cli/prepare_command.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ckpt/remote_checkpoints.h"
#include "config/config.h"
#include "data/documents.h"
#include "data/s3_data.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"
#include "parallel/agreement.h"
#include "parallel/mpi_communicator.h"
#include "kernels/base/error.h"
#include "runtime/timer.h"
#include "storage/s3_client.h"
#include "storage/s3_uri.h"

namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace trident {

namespace {

std::string sha256_of_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), "cannot read '" + path + "'");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), buf.size());
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char digest[32];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  std::string hex;
  char byte[3];
  for (unsigned i = 0; i < length; i++) {
    std::snprintf(byte, sizeof byte, "%02x", digest[i]);
    hex += byte;
  }
  return hex;
}

// The files a tokenizer is made of, for the sidecar's checksums.
std::vector<std::string> tokenizer_files(const std::string& path) {
  if (path.empty()) return {};
  if (!fs::is_directory(path)) return {path};
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(path))
    if (e.is_regular_file()) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    require(out.good(), "cannot write '" + tmp + "' (disk full?)");
  }
  fs::rename(tmp, path);
}

std::string part_prefix(const std::string& out, int rank, int ranks) {
  return out + ".part" + std::to_string(rank) + "of" + std::to_string(ranks);
}

constexpr const char* kUsage =
    "usage: trident prepare --input PATH [--input PATH ...] --out PREFIX [--data.tokenizer=KIND]\n"
    "                       [--data.tokenizer_path=PATH] [--json_key text] [--train_tokenizer VOCAB]\n"
    "  Tokenizes text (documents split at lines holding only '%', or one per file) or JSONL\n"
    "  (.jsonl/.json, the document under --json_key), gzip of either, into Megatron's indexed\n"
    "  dataset PREFIX.bin + PREFIX.idx (one sequence per document, the end-of-document token\n"
    "  appended) and PREFIX.json, with the tokenizer KIND: byte (the default), gpt2, llama3 or\n"
    "  sentencepiece. Under mpirun every rank tokenizes its share of the input.\n"
    "  --train_tokenizer VOCAB first trains a SentencePiece BPE with Llama 2's settings on\n"
    "  the input (PREFIX.model) and prepares with it. PREFIX may be s3://bucket/key: the files\n"
    "  are made in data.cache_dir, then uploaded (S3 settings: checkpoint.s3_*).\n";

}  // namespace

int run_prepare_command(const std::vector<std::string>& args) {
  std::vector<std::string> inputs;
  std::string out, json_key = "text";
  int train_vocab = 0;
  bool help = false;
  po::options_description own("Options of 'trident prepare'");
  own.add_options()("help,h", po::bool_switch(&help), "show this help")(
      "input", po::value(&inputs)->composing(), "text or JSONL file, folder or glob (repeatable)")(
      "out", po::value(&out), "output prefix: PREFIX.bin, PREFIX.idx, PREFIX.json")(
      "json_key", po::value(&json_key)->default_value(json_key), "the document's key in JSONL lines")(
      "train_tokenizer", po::value(&train_vocab)->default_value(0),
      "train a SentencePiece BPE of this vocabulary on the input first (PREFIX.model)");
  std::vector<std::string> rest = take_command_options(args, own, kUsage);
  auto watchdog = std::make_shared<Watchdog>();
  MpiCommunicator world(MPI_COMM_WORLD, "world", watchdog);
  const bool root = world.rank() == 0;
  if (help) {
    if (root) {
      std::ostringstream text;
      text << kUsage << "\n" << own;
      std::printf("%s", text.str().c_str());
    }
    return 0;
  }
  // A tokenizer trained here lands beside the dataset.
  if (train_vocab > 0 && !out.empty()) rest.push_back("--data.tokenizer_path=" + out + ".model");
  CommandLine cl = parse_command_line("prepare", rest);  // --data.tokenizer and friends, --config
  DataConfig& data = cl.config.data;
  watchdog->timeout_s = cl.config.parallel.timeout_s;
  require(!inputs.empty(), "prepare needs --input PATH (text, JSONL, gzip; files, folders or globs)");
  require(!out.empty(), "prepare needs --out PREFIX");
  require(train_vocab == 0 || data.tokenizer == TokenizerKind::sentencepiece,
          "--train_tokenizer trains a SentencePiece model: use --data.tokenizer=sentencepiece");
  require(train_vocab >= 0, "--train_tokenizer must be a vocabulary size");
  // To S3: made under data.cache_dir (where a run reading s3://... keeps its copy), then
  // uploaded; the bucket checked before any work.
  const std::string destination = out;
  std::unique_ptr<S3Client> s3;
  if (is_s3_uri(destination)) {
    const S3Uri uri = parse_s3_uri(destination);
    require(!uri.prefix.empty(), "prepare --out " + destination + " needs a key after the bucket");
    out = local_copy_of(destination, data_cache_dir(data));
    run_collectively([&] {
      if (!root) return;
      s3 = std::make_unique<S3Client>(uri.bucket, data_s3_settings(cl.config), std::make_shared<AwsCredentialProvider>());
      s3->check_bucket(uri.prefix.substr(0, uri.prefix.rfind('/') == std::string::npos ? 0 : uri.prefix.rfind('/')));
    });
    if (train_vocab > 0) data.tokenizer_path = out + ".model";
  }
  const std::vector<InputFile> files = list_inputs(inputs);
  const uint64_t total = total_bytes(files);
  if (fs::path(out).has_parent_path()) fs::create_directories(fs::path(out).parent_path());
  // Every rank writes its part beside PREFIX and rank 0 merges them: a folder all see.
  if (world.size() > 1) {
    std::string probe = root ? out + ".probe-" + std::to_string(getpid()) : "";
    if (root) std::ofstream(probe) << "trident\n";
    probe = broadcast_string(probe);
    const bool seen = fs::exists(probe);
    const bool all = world.all_reduce(seen ? 0.0 : 1.0, ReduceOp::max) == 0;
    world.barrier();
    if (root) fs::remove(probe);
    if (!all)
      throw AgreedUsageError("prepare under mpirun: the ranks write their parts beside " + out +
                             " and rank 0 merges them, but some ranks do not see its folder (node-local disks): give "
                             "a folder on a file system every node shares" +
                             (is_s3_uri(destination) ? std::string(" (data.cache_dir)") : std::string("")));
  }
  Timer timer;

  // The tokenizer: trained on the input by rank 0, or loaded; then on every rank.
  if (train_vocab > 0) {
    run_collectively([&] {
      if (!root) return;
      const std::string corpus = out + ".tokenizer-corpus.tmp";
      {
        std::ofstream text(corpus, std::ios::binary | std::ios::trunc);
        for_each_document(files, 0, total, json_key, [&](std::string_view doc) { text << doc << "\n"; });
        require(text.good(), "cannot write '" + corpus + "'");
      }
      train_sentencepiece({corpus}, train_vocab, out);
      fs::remove(corpus);
      std::printf("prepare: trained a SentencePiece BPE of %d pieces on the input: %s (%.1f s)\n", train_vocab,
                  data.tokenizer_path.c_str(), timer.seconds());
    });
  }
  std::unique_ptr<Tokenizer> tokenizer;
  run_collectively([&] { tokenizer = make_tokenizer(data.tokenizer, data.tokenizer_path); });
  if (root && cl.given.count("data.tokenizer") == 0)  // the default, said: a newcomer may have meant another
    std::printf("prepare: no --data.tokenizer given: byte-level tokens (256 ids, one per byte); "
                "--data.tokenizer=gpt2, llama3 or sentencepiece for another\n");
  const int32_t eod = tokenizer->special_tokens().eos;
  const TokenType type = token_type_for_vocabulary(tokenizer->vocab_size());

  // This rank's share of the input bytes, tokenized into a part of its own. The part
  // goes when prepare ends, whether it succeeded or not.
  const int rank = world.rank(), ranks = world.size();
  struct RemovePart {
    std::string prefix;
    ~RemovePart() {
      std::error_code ignored;
      for (const char* ext : {".bin", ".idx"}) fs::remove(prefix + ext, ignored);
    }
  } remove_part{part_prefix(out, rank, ranks)};
  const uint64_t begin = total * rank / ranks, end = total * (rank + 1) / ranks;
  uint64_t part_documents = 0, part_tokens = 0;
  run_collectively([&] {
    IndexedDatasetWriter part(part_prefix(out, rank, ranks), type);
    std::vector<int32_t> ids;
    Timer shown;
    for_each_document(
        files, begin, end, json_key,
        [&](std::string_view doc) {
          ids = tokenizer->encode(doc);
          if (eod >= 0) ids.push_back(eod);
          part.add_document(ids);
        },
        [&](uint64_t bytes) {
          if (!root || shown.seconds() < 1.0) return;
          shown = Timer();
          const double mb_s = bytes / 1e6 / timer.seconds(), share = static_cast<double>(end - begin);
          std::printf("prepare: %.1f%% of rank 0's %.1f MB, %.1f MB/s per rank, %zu documents, %llu tokens, ETA %.0fs\n",
                      100.0 * bytes / share, share / 1e6, mb_s, part.documents(),
                      static_cast<unsigned long long>(part.tokens()), (share - bytes) / 1e6 / std::max(mb_s, 1e-9));
          std::fflush(stdout);
        });
    part.finish();
    part_documents = part.documents();
    part_tokens = part.tokens();
  });

  // The parts, in rank order, into one dataset; then the sidecar; the parts go.
  double counts[2] = {static_cast<double>(part_documents), static_cast<double>(part_tokens)};
  world.all_reduce(std::span<double>(counts, 2));
  run_collectively([&] {
    if (!root) return;
    IndexedDatasetWriter merged(out, type);
    for (int r = 0; r < ranks; r++) merged.add_dataset(IndexedDataset(part_prefix(out, r, ranks)));
    require(merged.documents() > 0, "the input holds no documents (" + std::to_string(files.size()) + " files)");
    merged.finish();
    nlohmann::json files_json = nlohmann::json::array(), inputs_json = nlohmann::json::array();
    for (const std::string& f : tokenizer_files(data.tokenizer_path))
      files_json.push_back({{"path", f}, {"sha256", sha256_of_file(f)}});
    for (const InputFile& f : files) inputs_json.push_back({{"path", f.path}, {"bytes", f.bytes}});
    const nlohmann::json sidecar = {{"format", "trident-prepare-v1"},
                                    {"tokenizer", {{"kind", tokenizer->kind()}, {"files", files_json},
                                                   {"vocab_size", tokenizer->vocab_size()}, {"eod", eod}}},
                                    {"dtype", token_type_name(type)},
                                    {"documents", merged.documents()},
                                    {"tokens", merged.tokens()},
                                    {"json_key", json_key},
                                    {"inputs", inputs_json}};
    write_atomically(out + ".json", sidecar.dump(2) + "\n");
  });
  world.barrier();
  if (root)
    std::printf("prepared %s.bin/.idx: %.0f documents, %.0f tokens (%s, %s), %.1f MB of input in %.2f s "
                "(%.1f MB/s) on %d rank(s)\n",
                out.c_str(), counts[0], counts[1], tokenizer->kind().c_str(), token_type_name(type), total / 1e6,
                timer.seconds(), total / 1e6 / timer.seconds(), ranks);
  if (is_s3_uri(destination)) {
    run_collectively([&] {
      if (!root) return;
      const S3Uri uri = parse_s3_uri(destination);
      const Timer uploading;
      double bytes = 0;
      std::vector<std::string> extensions = {".bin", ".idx", ".json"};
      if (train_vocab > 0) extensions.push_back(".model");
      for (const std::string& ext : extensions) {
        const S3Transfer t = s3->upload_file(out + ext, uri.prefix + ext);
        bytes += static_cast<double>(t.bytes);
        // The files stay where a run reading s3://... keeps its copy: that run need not fetch them.
        if (!t.etag.empty()) remember_copy(data_cache_dir(data), uri.bucket, uri.prefix + ext, t.etag, t.bytes);
      }
      std::printf("prepare: uploaded %s%s: %.1f MB in %.2f s\n", destination.c_str(),
                  train_vocab > 0 ? ".bin/.idx/.json/.model" : ".bin/.idx/.json", bytes / 1e6, uploading.seconds());
    });
  }
  return 0;
}

}  // namespace trident
