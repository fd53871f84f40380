// SentencePiece models (Llama 2 style: BPE with byte fallback) through Debian's
// libsentencepiece. Valid UTF-8 is encoded by SentencePiece itself; text with invalid
// bytes (which SentencePiece would turn into U+FFFD) is cut there: the valid parts are
// encoded (the dummy prefix only at the start of the text) and each invalid byte becomes
// its byte piece <0xNN>. Decoding is SentencePiece's, except that byte pieces give their
// raw bytes (SentencePiece maps bytes that are not valid UTF-8 to U+FFFD), so
// decode(encode(x)) == x for every x without U+2581: SentencePiece writes spaces as
// U+2581 before encoding, so a U+2581 of the text decodes as a space (as in Llama 2's
// own tokenizer; ids stay identical to SentencePiece's).
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace trident {

// `path`: a .model file. Throws UsageError naming the file if it does not load.
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& path);

}  // namespace trident
