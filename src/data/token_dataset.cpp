#include "data/token_dataset.h"

#include <glob.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "data/dataset_prefix_help.h"
#include "data/documents.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"
#include "kernels/base/error.h"
#include "runtime/random.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::string hex(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

// ---- in memory ------------------------------------------------------------------------

class InMemoryDataset final : public TokenDataset {
 public:
  InMemoryDataset(std::vector<int32_t> tokens, std::vector<uint64_t> starts, std::string description,
                  std::string fingerprint)
      : tokens_(std::move(tokens)), starts_(std::move(starts)), description_(std::move(description)),
        fingerprint_(std::move(fingerprint)) {}
  uint64_t tokens() const override { return tokens_.size(); }
  void read(uint64_t begin, size_t count, int32_t* out) const override {
    std::memcpy(out, tokens_.data() + begin, count * sizeof(int32_t));
  }
  const std::vector<uint64_t>& document_starts() const override { return starts_; }
  int64_t max_token() const override {
    return tokens_.empty() ? 0 : *std::max_element(tokens_.begin(), tokens_.end());
  }
  std::string describe() const override { return description_; }
  std::string fingerprint() const override { return fingerprint_; }

 private:
  std::vector<int32_t> tokens_;
  std::vector<uint64_t> starts_;
  std::string description_, fingerprint_;
};

// ---- Megatron -------------------------------------------------------------------------

class MegatronDataset final : public TokenDataset {
 public:
  explicit MegatronDataset(const std::string& prefix) : data_(prefix) {
    const MappedFile idx(prefix + ".idx");
    set_up(prefix, idx.data(), idx.size());
  }
  MegatronDataset(const std::string& name, const std::string& idx, std::unique_ptr<TokenBytes> bin)
      : data_(name, reinterpret_cast<const uint8_t*>(idx.data()), idx.size(), std::move(bin)) {
    set_up(name, reinterpret_cast<const uint8_t*>(idx.data()), idx.size());
  }
  uint64_t tokens() const override { return data_.tokens(); }
  void read(uint64_t begin, size_t count, int32_t* out) const override { data_.read(begin, count, out); }
  void prefetch(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const override { data_.prefetch(ranges); }
  void prefetch_in_background(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const override {
    data_.prefetch(ranges, true);
  }
  bool streamed() const override { return !data_.bin().local(); }
  std::string traffic() const override {
    const std::string t = data_.bin().traffic();
    return t.empty() ? "" : data_.prefix() + ".bin: " + t;
  }
  const std::vector<uint64_t>& document_starts() const override { return starts_; }
  int64_t max_token() const override { return data_.max_token(); }
  std::string describe() const override {
    return "Megatron indexed dataset " + data_.prefix() + " (" + token_type_name(data_.type()) + "): " +
           std::to_string(data_.documents()) + " documents, " + std::to_string(data_.tokens()) + " tokens" +
           (data_.bin().local() ? "" : ", streamed");
  }
  std::string fingerprint() const override { return fingerprint_; }

 private:
  // The documents' starts and the fingerprint, from the index (the same for a copy and
  // the object it was copied from: a checkpoint taken on either continues on the other).
  void set_up(const std::string& prefix, const uint8_t* idx, size_t idx_size) {
    for (size_t d = 0; d < data_.documents(); d++) {
      const uint64_t start = data_.sequence_start(data_.document_first_sequence(d));
      if (starts_.empty() || start > starts_.back()) starts_.push_back(start);  // empty documents add none
    }
    if (starts_.empty()) starts_.push_back(0);
    fingerprint_ = "megatron " + fs::path(prefix).filename().string() + " idx " + std::to_string(idx_size) +
                   " bytes fnv " + hex(fnv1a(idx, idx_size)) + ", " + std::to_string(data_.tokens()) + " tokens";
  }
  IndexedDataset data_;
  std::vector<uint64_t> starts_;
  std::string fingerprint_;
};

// ---- llm.c shards ---------------------------------------------------------------------

// llm.c's dev/data/data_common.py: 256 int32 of header (magic, version, token count),
// then the tokens. GPT-2: 20240520, version 1, uint16; Llama 3: 20240801, version 7, uint32.
constexpr int32_t kLlmcGpt2Magic = 20240520, kLlmcLlama3Magic = 20240801;
constexpr size_t kLlmcHeader = 256 * sizeof(int32_t);

class LlmcShards final : public TokenDataset {
 public:
  explicit LlmcShards(const std::vector<std::string>& files) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const std::string& f : files) {
      auto map = std::make_unique<MappedFile>(f);
      require(map->size() >= kLlmcHeader, f + ": " + std::to_string(map->size()) +
                                              " bytes, shorter than llm.c's 1024-byte header (truncated?)");
      int32_t header[3];
      std::memcpy(header, map->data(), sizeof header);
      TokenType type;
      if (header[0] == kLlmcGpt2Magic && header[1] == 1) type = TokenType::uint16;
      else if (header[0] == kLlmcLlama3Magic && header[1] == 7) type = TokenType::uint32;
      else
        throw UsageError(f + ": magic " + std::to_string(header[0]) + " version " + std::to_string(header[1]) +
                         " at byte 0 is neither llm.c's GPT-2 shard (20240520, 1) nor its Llama 3 shard (20240801, 7)");
      const uint64_t n = static_cast<uint32_t>(header[2]);
      const uint64_t want = kLlmcHeader + n * token_bytes(type);
      require(map->size() == want, f + ": the header says " + std::to_string(n) + " tokens, " + std::to_string(want) +
                                       " bytes, the file has " + std::to_string(map->size()) + " (truncated?)");
      require(shards_.empty() || type == shards_.front().type, f + ": a shard of another token type than the first");
      h = fnv1a(map->data(), kLlmcHeader, fnv1a(f.data(), f.size(), h));
      shards_.push_back({std::move(map), type, total_, n});
      total_ += n;
    }
    require(total_ > 0, "data.path: the llm.c shards hold no tokens");
    // llm.c's writers put the document delimiter first in every document (GPT-2's
    // <|endoftext|>, Llama 3's <|begin_of_text|>): the first token names it.
    int32_t delimiter = 0;
    read(0, 1, &delimiter);
    std::vector<int32_t> chunk(1 << 20);
    for (uint64_t at = 0; at < total_; at += chunk.size()) {
      const size_t count = static_cast<size_t>(std::min<uint64_t>(chunk.size(), total_ - at));
      read(at, count, chunk.data());
      for (size_t i = 0; i < count; i++) {
        if (chunk[i] == delimiter) starts_.push_back(at + i);
        max_token_ = std::max<int64_t>(max_token_, chunk[i]);
      }
    }
    fingerprint_ = "llm.c " + std::to_string(files.size()) + " shards fnv " + hex(h) + ", " + std::to_string(total_) +
                   " tokens";
  }
  uint64_t tokens() const override { return total_; }
  void read(uint64_t begin, size_t count, int32_t* out) const override {
    for (const Shard& s : shards_) {
      if (count == 0) return;
      if (begin >= s.first + s.tokens) continue;
      const uint64_t offset = begin - s.first;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(count, s.tokens - offset));
      decode_tokens(s.map->data() + kLlmcHeader + offset * token_bytes(s.type), s.type, n, out);
      out += n;
      begin += n;
      count -= n;
    }
    check(count == 0, "LlmcShards::read past the end");
  }
  const std::vector<uint64_t>& document_starts() const override { return starts_; }
  int64_t max_token() const override { return max_token_; }
  std::string describe() const override {
    return "llm.c shards (" + std::string(token_type_name(shards_.front().type)) + "): " + std::to_string(shards_.size()) +
           " files, " + std::to_string(starts_.size()) + " documents, " + std::to_string(total_) + " tokens";
  }
  std::string fingerprint() const override { return fingerprint_; }

 private:
  struct Shard {
    std::unique_ptr<MappedFile> map;
    TokenType type;
    uint64_t first, tokens;
  };
  std::vector<Shard> shards_;
  uint64_t total_ = 0;
  std::vector<uint64_t> starts_;
  int64_t max_token_ = 0;
  std::string fingerprint_;
};

// ---- text -----------------------------------------------------------------------------

std::vector<fs::path> text_files(const std::string& path) {
  require(fs::exists(path), "data.path '" + path + "' does not exist");
  if (!fs::is_directory(path)) return {path};
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(path)) {
    const std::string ext = entry.path().extension().string();
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && ext != ".dat" && ext != ".u8" && !name.starts_with(".")) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  require(!files.empty(), "data.path '" + path + "' holds no text files");
  return files;
}

// Splits a file's text at lines holding only '%' (the fortune format); a file without
// such lines is one document. Each document keeps its trailing newline.
std::vector<std::string> split_documents(const std::string& text) {
  std::vector<std::string> docs;
  std::istringstream in(text);
  std::string line, doc;
  while (std::getline(in, line)) {
    if (line == "%") {
      if (!doc.empty()) docs.push_back(std::move(doc));
      doc.clear();
    } else {
      doc += line + "\n";
    }
  }
  if (!doc.empty()) docs.push_back(std::move(doc));
  return docs;
}

bool is_number(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g{};
  std::vector<std::string> files;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; i++) files.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  std::sort(files.begin(), files.end());
  return files;
}

double entropy_of(const Split& split, int64_t max_token) {
  std::vector<double> count(static_cast<size_t>(std::max<int64_t>(max_token, 0)) + 1, 0.0);
  std::vector<int32_t> chunk(1 << 16);
  double total = 0;
  for (const TokenRange& r : split.ranges) {
    // Everything up to 16M tokens, else 256 evenly spaced chunks of 64K; a streamed
    // dataset 16 chunks (1M tokens a rank), fetched together.
    const uint64_t n = r.size();
    const uint64_t step = r.dataset->streamed() ? std::max<uint64_t>(n / 16, chunk.size())
                          : n <= (16u << 20)    ? chunk.size()
                                                : n / 256;
    std::vector<std::pair<uint64_t, uint64_t>> chunks;
    for (uint64_t at = r.begin; at < r.end; at += step) chunks.emplace_back(at, std::min<uint64_t>(chunk.size(), r.end - at));
    for (size_t first = 0; first < chunks.size(); first += 64) {
      r.dataset->prefetch({chunks.begin() + first, chunks.begin() + std::min(chunks.size(), first + 64)});
      for (size_t c = first; c < std::min(chunks.size(), first + 64); c++) {
        const auto [at, len] = chunks[c];
        r.dataset->read(at, len, chunk.data());
        for (size_t i = 0; i < len; i++) {
          if (chunk[i] < 0) throw UsageError(r.dataset->describe() + ": a negative token id at token " + std::to_string(at + i));
          if (static_cast<size_t>(chunk[i]) >= count.size()) count.resize(static_cast<size_t>(chunk[i]) + 1, 0.0);
          count[chunk[i]] += 1;
        }
        total += static_cast<double>(len);
      }
    }
  }
  double h = 0;
  for (double c : count)
    if (c > 0) h -= c / total * std::log(c / total);
  return h;
}

}  // namespace

uint64_t Split::tokens() const {
  uint64_t n = 0;
  for (const TokenRange& r : ranges) n += r.size();
  return n;
}

std::unique_ptr<TokenDataset> in_memory_dataset(std::vector<int32_t> tokens, std::vector<uint64_t> document_starts,
                                                std::string description, std::string fingerprint) {
  return std::make_unique<InMemoryDataset>(std::move(tokens), std::move(document_starts), std::move(description),
                                           std::move(fingerprint));
}

std::unique_ptr<TokenDataset> open_megatron_dataset(const std::string& prefix) {
  return std::make_unique<MegatronDataset>(prefix);
}

std::unique_ptr<TokenDataset> open_megatron_dataset(const std::string& name, const std::string& idx,
                                                    std::unique_ptr<TokenBytes> bin) {
  return std::make_unique<MegatronDataset>(name, idx, std::move(bin));
}

std::unique_ptr<TokenDataset> open_llmc_shards(const std::vector<std::string>& files) {
  return std::make_unique<LlmcShards>(files);
}

std::unique_ptr<TokenDataset> open_text_dataset(const std::string& path, const Tokenizer& tokenizer,
                                                const std::string& json_key) {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> starts;
  size_t files = 0;
  const int32_t eod = tokenizer.special_tokens().eos;
  const auto add = [&](std::string_view doc, bool separator_line) {
    starts.push_back(tokens.size());
    // Documents end with the tokenizer's end-of-document token; byte-level tokens
    // keep the separator line they had, so the model sees the format.
    const std::vector<int32_t> ids =
        tokenizer.encode(eod >= 0 || !separator_line ? std::string(doc) : std::string(doc) + "%\n");
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    if (eod >= 0) tokens.push_back(eod);
  };
  for (const fs::path& file : text_files(path)) {
    const InputFile input = list_inputs({file.string()}).front();
    if (input.jsonl || input.gzip) {  // as `trident prepare` reads it: a document per line under json_key
      for_each_document({input}, 0, UINT64_MAX, json_key, [&](std::string_view doc) { add(doc, false); });
    } else {
      std::ifstream in(file, std::ios::binary);
      require(in.good(), "cannot read '" + file.string() + "'");
      std::ostringstream text;
      text << in.rdbuf();
      for (const std::string& doc : split_documents(text.str())) add(doc, true);
    }
    files++;
  }
  const uint64_t h = fnv1a(tokens.data(), tokens.size() * sizeof(int32_t));
  const std::string description = "text " + path + ": " + std::to_string(files) + " files, " +
                                  std::to_string(starts.size()) + " documents, " + std::to_string(tokens.size()) +
                                  " tokens (" + tokenizer.kind() + ")";
  return in_memory_dataset(std::move(tokens), std::move(starts), description,
                           "text " + tokenizer.kind() + " fnv " + hex(h) + ", " + std::to_string(files) + " files");
}

namespace {

// One data.path entry: a Megatron prefix, a glob of llm.c shards, or text.
std::unique_ptr<TokenDataset> open_one(const std::string& path, const Tokenizer& tokenizer, size_t& files,
                                       const std::string& json_key, const RemoteOpener& open_remote) {
  if (path.starts_with("s3://")) {
    check(static_cast<bool>(open_remote), "an s3:// entry left for the dataset to open, without an opener");
    files += 2;
    return open_remote(path);
  }
  if (fs::exists(path + ".idx") || fs::exists(path + ".bin")) {
    files += 2;
    return open_megatron_dataset(path);
  }
  // One file of a Megatron pair named in place of the pair, or the folder holding
  // prepared datasets: say what to pass.
  if (path.ends_with(".bin") || path.ends_with(".idx")) {
    const std::string prefix = path.substr(0, path.size() - 4);
    refuse_one_file_of_dataset("data.path", path, fs::exists(prefix + ".bin") && fs::exists(prefix + ".idx"));
  }
  if (fs::is_directory(path)) {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(path))
      if (entry.is_regular_file()) files.push_back((fs::path(path) / entry.path().filename()).string());
    refuse_folder_of_datasets("data.path", path, megatron_prefixes(files));
  }
  if (path.ends_with(".bin") || path.find_first_of("*?[") != std::string::npos) {
    const std::vector<std::string> shards = glob_files(path);
    require(!shards.empty(), "data.path '" + path + "' matches no file");
    files += shards.size();
    return open_llmc_shards(shards);
  }
  files += fs::is_directory(path) ? text_files(path).size() : 1;
  return open_text_dataset(path, tokenizer, json_key);
}

}  // namespace

TrainingData open_training_data(const std::string& path, const std::string& val_path, double val_fraction,
                                const Tokenizer& tokenizer, const std::string& json_key,
                                const RemoteOpener& open_remote) {
  TrainingData data;
  // "w1 p1 w2 p2 ...": a blend; one path otherwise.
  std::istringstream words(path);
  std::vector<std::string> parts{std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
  std::vector<std::pair<double, std::string>> entries;
  if (parts.size() >= 2 && parts.size() % 2 == 0 && is_number(parts[0])) {
    for (size_t i = 0; i < parts.size(); i += 2) {
      require(is_number(parts[i]) && std::stod(parts[i]) > 0,
              "data.path: a blend is 'weight path weight path ...' with positive weights, got '" + parts[i] + "'");
      entries.emplace_back(std::stod(parts[i]), parts[i + 1]);
    }
  } else {
    entries.emplace_back(1.0, path);
  }
  double total_weight = 0;
  for (const auto& e : entries) total_weight += e.first;
  std::unique_ptr<TokenDataset> val_dataset;
  for (const auto& [weight, p] : entries) {
    // llm.c names its validation shards *_val_*: they are the validation split.
    std::vector<std::string> val_shards;
    std::unique_ptr<TokenDataset> d;
    if (val_path.empty() && !p.starts_with("s3://") && (p.ends_with(".bin") || p.find_first_of("*?[") != std::string::npos)) {
      std::vector<std::string> train_shards;
      for (const std::string& f : glob_files(p)) (f.find("_val_") != std::string::npos ? val_shards : train_shards).push_back(f);
      if (!val_shards.empty() && !train_shards.empty()) {
        d = open_llmc_shards(train_shards);
        data.files += train_shards.size() + val_shards.size();
        data.datasets.push_back(open_llmc_shards(val_shards));
        const TokenDataset& v = *data.datasets.back();
        data.val.ranges.push_back({&v, 0, v.tokens()});
        data.val.weights.push_back(weight / total_weight);
      }
    }
    if (d == nullptr) d = open_one(p, tokenizer, data.files, json_key, open_remote);
    require(d->tokens() > 0, "data.path '" + p + "' holds no tokens (an empty dataset)");
    const TokenDataset& ds = *d;
    data.datasets.push_back(std::move(d));
    data.documents += ds.document_starts().size();
    data.max_token = std::max(data.max_token, ds.max_token());
    uint64_t train_end = ds.tokens();
    if (val_path.empty() && val_shards.empty()) {
      // The last val_fraction of the documents (at least one) are held out.
      const size_t docs = ds.document_starts().size();
      size_t n_val = static_cast<size_t>(std::floor(val_fraction * docs));
      if (val_fraction > 0 && n_val == 0 && docs > 1) n_val = 1;
      train_end = n_val > 0 ? ds.document_starts()[docs - n_val] : ds.tokens();
      if (n_val > 0) {
        data.val.ranges.push_back({&ds, train_end, ds.tokens()});
        data.val.weights.push_back(weight / total_weight);
      }
    }
    data.train.ranges.push_back({&ds, 0, train_end});
    data.train.weights.push_back(weight / total_weight);
    data.description += (data.description.empty() ? "" : "; ") +
                        (entries.size() > 1 ? std::to_string(weight / total_weight).substr(0, 5) + " x " : "") +
                        ds.describe();
    data.fingerprint += (data.fingerprint.empty() ? "" : "; ") + ds.fingerprint();
  }
  if (!val_path.empty()) {
    data.datasets.push_back(open_one(val_path, tokenizer, data.files, json_key, open_remote));
    const TokenDataset& v = *data.datasets.back();
    data.val.ranges.push_back({&v, 0, v.tokens()});
    data.val.weights.push_back(1.0);
    data.max_token = std::max(data.max_token, v.max_token());
  }
  data.unigram_entropy = entropy_of(data.train, data.max_token);
  return data;
}

// ---- sampling -------------------------------------------------------------------------

void require_data_fits(const TrainingData& data, int vocab_size, int seq_len) {
  require(data.max_token < vocab_size, "the data holds token id " + std::to_string(data.max_token) +
                                           ", beyond model.vocab_size (" + std::to_string(vocab_size) +
                                           "): " + data.description);
  BatchSampler sequences_to_draw(data.train, seq_len, /*seed=*/0, /*stream=*/0);  // its checks alone
}

BatchSampler::BatchSampler(const Split& split, int seq_len, uint64_t seed, uint64_t stream)
    : split_(split), T_(seq_len), seed_(seed), stream_(stream) {
  require(!split.ranges.empty(), "no data to draw sequences from");
  for (const TokenRange& r : split.ranges) streamed_ = streamed_ || r.dataset->streamed();
  for (const TokenRange& r : split.ranges)
    require(r.size() > static_cast<uint64_t>(seq_len) + 1,
            "the data has " + std::to_string(r.size()) + " tokens in a split, fewer than one sequence of " +
                std::to_string(seq_len + 1) + " (lower model.seq_len or add data)");
}

std::vector<std::pair<const TokenDataset*, uint64_t>> BatchSampler::starts(int64_t step, int first, int count) const {
  std::vector<std::pair<const TokenDataset*, uint64_t>> at(count);
  for (int i = 0; i < count; i++) {
    const uint64_t index = (static_cast<uint64_t>(step) << 24) + first + i;
    // The blend's dataset, by its weight (one dataset: no draw).
    size_t which = 0;
    if (split_.ranges.size() > 1) {
      const double u = uniform_open(hash_key(seed_, stream_ ^ 0x626c656e64ull, index));  // "blend"
      double cumulative = 0;
      for (which = 0; which + 1 < split_.ranges.size(); which++)
        if (u < (cumulative += split_.weights[which])) break;
    }
    const TokenRange& r = split_.ranges[which];
    const uint64_t starts = r.size() - T_;  // start + T is the last target
    at[i] = {r.dataset, r.begin + hash_key(seed_, stream_, index) % starts};
  }
  return at;
}

void BatchSampler::prefetch(const std::vector<std::pair<const TokenDataset*, uint64_t>>& at, bool in_background) const {
  for (size_t d = 0; d < split_.ranges.size(); d++) {
    const TokenDataset* dataset = split_.ranges[d].dataset;
    bool seen = false;  // a dataset named by two ranges of a blend: asked once
    for (size_t e = 0; e < d; e++) seen = seen || split_.ranges[e].dataset == dataset;
    if (seen) continue;
    std::vector<std::pair<uint64_t, uint64_t>> wanted;
    for (const auto& [in, start] : at)
      if (in == dataset) wanted.emplace_back(start, T_ + 1);
    if (wanted.empty()) continue;
    if (in_background) dataset->prefetch_in_background(wanted);
    else dataset->prefetch(wanted);
  }
}

void BatchSampler::prefetch(int64_t step, int first, int count) const {
  if (streamed_) prefetch(starts(step, first, count), true);
}

void BatchSampler::fill(int64_t step, int first, int count, std::vector<int32_t>& inputs,
                        std::vector<int32_t>& targets) const {
  inputs.resize(static_cast<size_t>(count) * T_);
  targets.resize(static_cast<size_t>(count) * T_);
  window_.resize(T_ + 1);
  // A streamed dataset fetches a batch's sequences together, then they are read.
  const std::vector<std::pair<const TokenDataset*, uint64_t>> at = starts(step, first, count);
  if (streamed_) prefetch(at, false);
  for (int i = 0; i < count; i++) {
    at[i].first->read(at[i].second, T_ + 1, window_.data());
    std::copy(window_.begin(), window_.end() - 1, inputs.begin() + static_cast<size_t>(i) * T_);
    std::copy(window_.begin() + 1, window_.end(), targets.begin() + static_cast<size_t>(i) * T_);
  }
}

}  // namespace trident
