// Tokenizers behind one interface (data.tokenizer, data.tokenizer_path):
//   byte           ids = the UTF-8 bytes, vocabulary 256, no special tokens
//   gpt2           GPT-2's byte-level BPE exactly as tiktoken encodes it (r50k_base):
//                  a folder with encoder.json + vocab.bpe, or a .tiktoken rank file;
//                  <|endoftext|> = 50256
//   llama3         Meta's Llama 3 tokenizer.model (a .tiktoken file of 128,000 ranks), Llama 3's
//                  pattern and its 256 special tokens (128000 <|begin_of_text|> ...)
//   sentencepiece  a SentencePiece .model (Llama 2 style), through libsentencepiece
// Shared facts and test vectors: shared/reference/DATA_FORMATS.md sections 1 and 2.
//
// encode() treats special-token strings in the text as text (tiktoken's encode_ordinary);
// encode_allowing_special() turns them into their ids. Text that is not valid UTF-8 is
// encoded byte by byte where the tokenizer can (byte, gpt2, llama3: byte-level BPE;
// sentencepiece with byte pieces); otherwise encode() throws one UsageError naming the
// byte offset. Bad tokenizer files are one UsageError naming the file (and line).
// A tokenizer is immutable after construction: encode/decode may run on many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/choices.h"
#include "config/config.h"

namespace trident {

// Ids of the special tokens a tokenizer has; -1 where it has none. GPT-2 has one,
// <|endoftext|>, for all three. A document boundary in pretraining data is eos (or bos
// first, as llm.c writes Llama 3 data); eot is Llama 3's end of a chat turn.
struct SpecialTokens {
  int32_t bos = -1;  // beginning of a sequence (gpt2: <|endoftext|>, llama3: <|begin_of_text|>, sp: <s>)
  int32_t eos = -1;  // end of a sequence or document (gpt2: <|endoftext|>, llama3: <|end_of_text|>, sp: </s>)
  int32_t eot = -1;  // end of a turn (gpt2: <|endoftext|>, llama3: <|eot_id|> (a stop token); sp: none)
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // byte | gpt2 | llama3 | sentencepiece
  virtual std::string kind() const = 0;
  // Ids are 0 .. vocab_size() - 1 (special tokens included).
  virtual int vocab_size() const = 0;
  virtual SpecialTokens special_tokens() const = 0;
  // One line: the kind, the file it came from, the vocabulary size.
  virtual std::string describe() const = 0;

  // Text -> ids; special-token strings in the text are plain text.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Text -> ids; special-token strings in the text become their ids (tiktoken's
  // allowed_special="all"). Tokenizers without such strings: encode().
  virtual std::vector<int32_t> encode_allowing_special(std::string_view text) const { return encode(text); }
  // Ids -> text (bytes: a cut in the middle of a UTF-8 character stays cut). An id
  // outside the vocabulary is a UsageError naming it.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
};

// Loads a tokenizer. `path`: unused for byte; for gpt2 a folder holding encoder.json and
// vocab.bpe, or a .tiktoken file; for llama3 Meta's tokenizer.model (or a folder holding
// it); for sentencepiece a .model file. Throws UsageError on an unknown kind or a file
// that is missing or does not parse (naming the file and line).
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, const std::string& path);

// data.eod_token where the config leaves it to the tokenizer (-1): its end-of-sequence
// id (-1 again if it has none; document masking then refuses to start).
void resolve_eod_token(DataConfig& data, const Tokenizer& tokenizer);

// Trains a SentencePiece BPE model with Llama 2's settings (model_type bpe, byte_fallback,
// split_digits, identity normalization, add_dummy_prefix, remove_extra_whitespaces false,
// allow_whitespace_only_pieces, character_coverage 0.99995, max_sentence_length 4192;
// unk 0, bos 1, eos 2) on the lines of `files`, or of `text`. Writes out_prefix.model and
// out_prefix.vocab and returns the .model's path. Throws UsageError if training fails.
std::string train_sentencepiece(const std::vector<std::string>& files, int vocab_size, const std::string& out_prefix);
std::string train_sentencepiece_on_text(std::string_view text, int vocab_size, const std::string& out_prefix);

// UTF-8 helpers shared by the tokenizers.
// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 if the byte there does
// not start one (stray continuation byte, overlong form, surrogate, > U+10FFFF, cut short).
int utf8_sequence_length(std::string_view s, size_t i);
// Offset of the first byte that does not start a valid sequence, or npos.
size_t first_invalid_utf8(std::string_view s);

}  // namespace trident
