#include "data/text_corpus.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"
#include "runtime/random.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

std::vector<fs::path> text_files(const std::string& path) {
  require(fs::exists(path), "data.path '" + path + "' does not exist");
  if (!fs::is_directory(path)) return {path};
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(path)) {
    const std::string ext = entry.path().extension().string();
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && ext != ".dat" && ext != ".u8" && !name.starts_with("."))
      files.push_back(entry.path());
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

}  // namespace

double TextCorpus::unigram_entropy() const {
  std::array<double, 256> count{};
  for (uint8_t t : train) count[t] += 1;
  double h = 0.0;
  for (double c : count)
    if (c > 0) h -= c / train.size() * std::log(c / train.size());
  return h;
}

TextCorpus load_text_corpus(const std::string& path, double val_fraction) {
  TextCorpus corpus;
  std::vector<std::string> docs;
  for (const fs::path& file : text_files(path)) {
    std::ifstream in(file, std::ios::binary);
    require(in.good(), "cannot read '" + file.string() + "'");
    std::ostringstream text;
    text << in.rdbuf();
    for (auto& d : split_documents(text.str())) docs.push_back(std::move(d));
    corpus.files++;
  }
  corpus.documents = docs.size();
  size_t n_val = static_cast<size_t>(std::floor(val_fraction * docs.size()));
  if (val_fraction > 0 && n_val == 0 && docs.size() > 1) n_val = 1;
  const size_t n_train = docs.size() - n_val;
  // Documents are joined with the separator line they had, so the model sees the format.
  for (size_t i = 0; i < docs.size(); i++) {
    auto& out = i < n_train ? corpus.train : corpus.val;
    out.insert(out.end(), docs[i].begin(), docs[i].end());
    out.insert(out.end(), {'%', '\n'});
  }
  return corpus;
}

BatchSampler::BatchSampler(const std::vector<uint8_t>& tokens, int seq_len, uint64_t seed, uint64_t stream)
    : tokens_(tokens), T_(seq_len), seed_(seed), stream_(stream) {
  require(tokens.size() > static_cast<size_t>(seq_len) + 1,
          "the text has " + std::to_string(tokens.size()) + " tokens, fewer than one sequence of " +
              std::to_string(seq_len + 1) + " (lower model.seq_len or add data)");
}

void BatchSampler::fill(int64_t step, int first, int count, std::vector<int32_t>& inputs,
                        std::vector<int32_t>& targets) const {
  inputs.resize(static_cast<size_t>(count) * T_);
  targets.resize(static_cast<size_t>(count) * T_);
  const uint64_t starts = tokens_.size() - T_;  // start + T is the last target
  for (int i = 0; i < count; i++) {
    const uint64_t key = hash_key(seed_, stream_, (static_cast<uint64_t>(step) << 24) + first + i);
    const size_t start = key % starts;
    for (int t = 0; t < T_; t++) {
      inputs[static_cast<size_t>(i) * T_ + t] = tokens_[start + t];
      targets[static_cast<size_t>(i) * T_ + t] = tokens_[start + t + 1];
    }
  }
}

}  // namespace trident
