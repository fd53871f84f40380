#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>
#include <unordered_map>

#include "kernels/base/error.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    require(!path.empty(), "data.tokenizer=sentencepiece needs data.tokenizer_path: a SentencePiece .model file");
    require(fs::exists(path), "data.tokenizer_path '" + path + "' does not exist");
    require(!fs::is_directory(path), "data.tokenizer_path '" + path + "' is a directory, expected a SentencePiece .model file");
    const auto status = sp_.Load(path);
    require(status.ok(), path + ": not a SentencePiece model (" + status.ToString() + ")");
    const int n = sp_.GetPieceSize();
    require(n > 0, path + ": a SentencePiece model without pieces");
    byte_of_.assign(n, -1);
    for (int id = 0; id < n; id++) {
      if (!sp_.IsByte(id)) continue;
      const std::string& piece = sp_.IdToPiece(id);  // "<0xAB>"
      require(piece.size() == 6 && piece.starts_with("<0x") && piece.back() == '>',
              path + ": byte piece " + std::to_string(id) + " is '" + piece + "', expected <0xNN>");
      const int byte = std::stoi(piece.substr(3, 2), nullptr, 16);
      byte_of_[id] = byte;
      id_of_byte_[byte] = id;
      bytes_++;
    }
    // The same model without the dummy prefix, for the parts after an invalid byte: the
    // serialized ModelProto with normalizer_spec (field 3) { add_dummy_prefix (field 3): false }
    // appended, which protobuf merges into the one already there.
    if (bytes_ == 256) {
      std::string proto = sp_.serialized_model_proto();
      proto += std::string("\x1a\x02\x18\x00", 4);
      const auto s = no_prefix_.LoadFromSerializedProto(proto);
      check(s.ok(), path + ": cannot reload the model without its dummy prefix: " + s.ToString());
    }
  }

  std::string kind() const override { return "sentencepiece"; }
  int vocab_size() const override { return sp_.GetPieceSize(); }
  SpecialTokens special_tokens() const override { return {sp_.bos_id(), sp_.eos_id(), -1}; }
  std::string describe() const override {
    return "sentencepiece: " + std::to_string(sp_.GetPieceSize()) + " pieces (" +
           (bytes_ == 256 ? "byte fallback" : "no byte fallback") + "), from " + path_;
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    size_t bad = first_invalid_utf8(text);
    if (bad == std::string_view::npos) {
      encode_valid(sp_, text, ids);
      return ids;
    }
    require(bytes_ == 256, "invalid UTF-8 at byte offset " + std::to_string(bad) + ", and the SentencePiece model " +
                               path_ + " has no byte pieces to encode it with");
    // The valid parts between invalid bytes; the dummy prefix only at the very start.
    size_t pos = 0;
    while (true) {
      const size_t end = bad == std::string_view::npos ? text.size() : pos + bad;
      if (end > pos) encode_valid(pos == 0 ? sp_ : no_prefix_, text.substr(pos, end - pos), ids);
      if (end == text.size()) break;
      size_t i = end;
      do {
        ids.push_back(id_of_byte_[static_cast<uint8_t>(text[i])]);
        i++;
      } while (i < text.size() && utf8_sequence_length(text, i) == 0);
      pos = i;
      if (pos == text.size()) break;
      bad = first_invalid_utf8(text.substr(pos));
    }
    return ids;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    const int n = sp_.GetPieceSize();
    std::vector<int> v(ids.begin(), ids.end());
    for (size_t i = 0; i < v.size(); i++)
      if (v[i] < 0 || v[i] >= n)
        throw UsageError("token id " + std::to_string(v[i]) + " (position " + std::to_string(i) +
                         ") is not in the vocabulary of " + path_ + " (0.." + std::to_string(n - 1) + ")");
    // SentencePiece's surfaces (dummy prefix removed, controls empty, <unk> as " ⁇ "),
    // but each byte piece as its raw byte.
    const sentencepiece::ImmutableSentencePieceText spt = sp_.DecodeIdsAsImmutableProto(v);
    check(spt.pieces_size() == v.size(), "SentencePiece decode returned " + std::to_string(spt.pieces_size()) +
                                             " pieces for " + std::to_string(v.size()) + " ids");
    std::string text;
    for (size_t i = 0; i < v.size(); i++) {
      if (byte_of_[v[i]] >= 0)
        text.push_back(static_cast<char>(byte_of_[v[i]]));
      else
        text += spt.pieces(static_cast<int>(i)).surface();
    }
    return text;
  }

 private:
  // Appends the ids of `text` (valid UTF-8) to `ids`.
  static void encode_valid(const sentencepiece::SentencePieceProcessor& sp, std::string_view text,
                           std::vector<int32_t>& ids) {
    static_assert(std::is_same_v<int32_t, int>, "SentencePiece's ids are int");
    if (ids.empty()) {  // straight into the result (Encode clears its output)
      const auto status = sp.Encode(text, &ids);
      check(status.ok(), "SentencePiece encode failed: " + status.ToString());
      return;
    }
    std::vector<int> part;
    const auto status = sp.Encode(text, &part);
    check(status.ok(), "SentencePiece encode failed: " + status.ToString());
    ids.insert(ids.end(), part.begin(), part.end());
  }

  std::string path_;
  sentencepiece::SentencePieceProcessor sp_, no_prefix_;
  std::vector<int> byte_of_;       // id -> byte of a byte piece, -1 for other pieces
  int id_of_byte_[256] = {};
  int bytes_ = 0;                  // byte pieces in the model
};

// The lines of a text, for SentencePieceTrainer (which trains on lines).
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::vector<std::string> lines) : lines_(std::move(lines)) {}
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override { i_++; }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::vector<std::string> lines_;
  size_t i_ = 0;
};

void add_lines(std::string_view text, std::vector<std::string>& lines) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    if (end > start) lines.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
}

std::string train(std::vector<std::string> lines, int vocab_size, const std::string& out_prefix) {
  require(vocab_size > 259, "a SentencePiece vocabulary needs more than 259 pieces (3 specials + 256 bytes), got " +
                                std::to_string(vocab_size));
  require(!lines.empty(), "no text to train a SentencePiece model on");
  if (fs::path(out_prefix).has_parent_path()) fs::create_directories(fs::path(out_prefix).parent_path());
  // Llama 2's trainer spec (shared/reference/DATA_FORMATS.md 2.1).
  const std::unordered_map<std::string, std::string> args = {
      {"model_prefix", out_prefix},
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "true"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"character_coverage", "0.99995"},
      {"max_sentence_length", "4192"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"minloglevel", "1"},
  };
  LineIterator it(std::move(lines));
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it);
  require(status.ok(), "training a SentencePiece model (" + out_prefix + ".model) failed: " + status.ToString());
  return out_prefix + ".model";
}

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

std::string train_sentencepiece(const std::vector<std::string>& files, int vocab_size, const std::string& out_prefix) {
  std::vector<std::string> lines;
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    require(in.good(), "cannot read training text '" + file + "'");
    std::ostringstream s;
    s << in.rdbuf();
    add_lines(s.str(), lines);
  }
  return train(std::move(lines), vocab_size, out_prefix);
}

std::string train_sentencepiece_on_text(std::string_view text, int vocab_size, const std::string& out_prefix) {
  std::vector<std::string> lines;
  add_lines(text, lines);
  return train(std::move(lines), vocab_size, out_prefix);
}

}  // namespace trident
