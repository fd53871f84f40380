// The documents of the inputs users bring to `trident prepare` (Megatron's
// preprocess_data.py reads JSONL; llm.c's scripts text): files, folders and globs of
//   - text: documents separated by lines holding only '%' (the fortune format), or
//     one per file when a file has no such line;
//   - JSONL (.jsonl, .json): one JSON object per line, the document under a key
//     (Megatron's --json-keys, default "text");
//   - gzip of either (.gz).
// The inputs laid end to end form one byte range; a rank handles the documents that
// start in its part of it, so ranks share nothing and together see every document
// once, in the same order as one rank would (a gzip file, which cannot be entered in
// the middle, belongs whole to the rank its first byte falls to).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace trident {

struct InputFile {
  std::string path;
  uint64_t bytes = 0;  // on disk
  bool gzip = false, jsonl = false;
};

// Every input file in order: folders in name order (hidden files and fortune's .dat
// and .u8 companions skipped), globs sorted. UsageError naming a path that matches nothing.
std::vector<InputFile> list_inputs(const std::vector<std::string>& paths);
uint64_t total_bytes(const std::vector<InputFile>& inputs);

// Calls f(document, file, line) for every non-empty document that starts at a byte in
// [begin, end) of the inputs laid end to end, in order; `progress(bytes)` with the
// bytes consumed so far. A JSONL line that is not a JSON object with `json_key` as a
// string is one UsageError naming the file and line.
void for_each_document(const std::vector<InputFile>& inputs, uint64_t begin, uint64_t end, const std::string& json_key,
                       const std::function<void(std::string_view document)>& f,
                       const std::function<void(uint64_t bytes)>& progress = {});

}  // namespace trident
