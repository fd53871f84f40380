// tiktoken's byte-level BPE, the engine of the gpt2 and llama3 tokenizers.
//
// Encoding (tiktoken src/lib.rs): a regex (PCRE2, UTF + UCP, JIT) splits the text into
// pieces; a piece found whole in the ranks is one token; any other is merged from its
// single bytes, always the adjacent pair whose concatenated bytes have the lowest rank
// (ties: the leftmost), until no adjacent pair is a token. Pieces of up to 128 bytes run
// tiktoken's own O(n m) loop; longer ones a heap over a linked list, O(n log n), with the
// same result. Ranks are looked up in an open-addressing table of the token bytes.
//
// The patterns are tiktoken's / Meta's verbatim, with \s and \S replaced by the explicit
// Unicode White_Space class (as Rust's engine has it: U+0085 in, U+180E and U+FEFF out;
// PCRE2's own \s also takes U+180E). Text that is not valid UTF-8 is cut at each run of
// invalid bytes; such a run is one piece of its own (byte-level BPE encodes any bytes).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace trident {

// tiktoken's r50k_base (GPT-2) pattern and Meta's Llama 3 pattern, verbatim.
extern const char* const kGpt2Pattern;
extern const char* const kLlama3Pattern;
// `pattern` with \s and \S (outside and inside character classes) replaced by the
// explicit White_Space class and its negation.
std::string with_explicit_white_space(const std::string& pattern);

// Meta's Llama 3 special tokens, id 128000 + index (meta-llama/llama3 llama/tokenizer.py).
std::vector<std::string> llama3_special_token_names();

// A .tiktoken rank file: one line "base64(token bytes) SP rank" per token. Returns the
// token bytes by rank (ranks must be 0..N-1, each once). Throws UsageError naming file:line.
std::vector<std::string> load_tiktoken_ranks(const std::string& file);

// GPT-2's encoder.json + vocab.bpe in `dir` (tiktoken's data_gym_to_mergeable_bpe_ranks):
// bytes by rank (256 single bytes in GPT-2's order, then one per merge line), checked
// against encoder.json; `endoftext` gets encoder.json's id of <|endoftext|>.
std::vector<std::string> load_gpt2_data_gym(const std::string& dir, int32_t* endoftext);

struct BpeOptions {
  std::string kind;           // gpt2 | llama3
  std::string pattern;        // PCRE2 pattern (already with the explicit White_Space class)
  bool meta_chunking = false; // Llama 3: <= 400,000 chars per call, <= 25,000 consecutive (non-)space chars
  SpecialTokens special;
  std::string source;         // where the ranks came from (describe())
};

class BpeTokenizer final : public Tokenizer {
 public:
  // tokens[r] = bytes of rank r (= token id r); specials: (string, id), ids not ranks.
  BpeTokenizer(std::vector<std::string> tokens, std::vector<std::pair<std::string, int32_t>> specials,
               BpeOptions options);
  ~BpeTokenizer() override;

  std::string kind() const override;
  int vocab_size() const override;
  SpecialTokens special_tokens() const override;
  std::string describe() const override;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode_allowing_special(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;

  // Appends the ids of `text` to `out` (no special tokens recognized).
  void encode_ordinary_into(std::string_view text, std::vector<int32_t>& out) const;
  // The pieces the pattern (and the chunking) cut `text` into, for tests.
  std::vector<std::string> pieces(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// gpt2: `path` a folder with encoder.json + vocab.bpe, or a .tiktoken file.
std::unique_ptr<BpeTokenizer> make_gpt2_tokenizer(const std::string& path);
// llama3: `path` Meta's tokenizer.model (a .tiktoken file), or a folder holding it.
std::unique_ptr<BpeTokenizer> make_llama3_tokenizer(const std::string& path);

}  // namespace trident
