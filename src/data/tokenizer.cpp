#include "data/tokenizer.h"

#include <cstring>

#include "data/bpe_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "kernels/base/error.h"

namespace trident {

namespace {

// ids = bytes: what TextCorpus trains on today.
class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  int vocab_size() const override { return 256; }
  SpecialTokens special_tokens() const override { return {}; }
  std::string describe() const override { return "byte: byte-level tokens (ids = UTF-8 bytes), vocabulary 256"; }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); i++) ids[i] = static_cast<uint8_t>(text[i]);
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string text(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); i++) {
      if (ids[i] < 0 || ids[i] >= 256)
        throw UsageError("token id " + std::to_string(ids[i]) + " (position " + std::to_string(i) +
                         ") is not in the byte vocabulary (0..255)");
      text[i] = static_cast<char>(ids[i]);
    }
    return text;
  }
};

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, const std::string& path) {
  switch (kind) {
    case TokenizerKind::byte: return std::make_unique<ByteTokenizer>();
    case TokenizerKind::gpt2: return make_gpt2_tokenizer(path);
    case TokenizerKind::llama3: return make_llama3_tokenizer(path);
    case TokenizerKind::sentencepiece: return make_sentencepiece_tokenizer(path);
  }
  fail("make_tokenizer: a tokenizer kind without a constructor");
}

int utf8_sequence_length(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b = at(i);
  if (b < 0x80) return 1;
  const size_t left = s.size() - i;
  const auto cont = [&](size_t k, uint8_t lo = 0x80, uint8_t hi = 0xBF) { return at(k) >= lo && at(k) <= hi; };
  if (b >= 0xC2 && b <= 0xDF) return left >= 2 && cont(i + 1) ? 2 : 0;
  if (b >= 0xE0 && b <= 0xEF) {
    if (left < 3) return 0;
    const uint8_t lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;  // no overlongs, no surrogates
    return cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    if (left < 4) return 0;
    const uint8_t lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;  // no overlongs, <= U+10FFFF
    return cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const int len = utf8_sequence_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

void resolve_eod_token(DataConfig& data, const Tokenizer& tokenizer) {
  if (data.eod_token < 0) data.eod_token = tokenizer.special_tokens().eos;
}

}  // namespace trident
