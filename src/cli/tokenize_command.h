#pragma once

#include <string>
#include <vector>

namespace trident {

// `trident tokenize --data.tokenizer=KIND --data.tokenizer_path=PATH [--add_bos] [--add_eos]
// [--allow_special] [--decode]`: UTF-8 text on stdin -> its ids as one JSON array on
// stdout; with --decode a JSON array of ids on stdin -> the text. Runs on rank 0 alone;
// returns the exit code (bad input: UsageError).
int run_tokenize_command(const std::vector<std::string>& args);

}  // namespace trident
