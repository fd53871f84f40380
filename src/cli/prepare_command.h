#pragma once

#include <string>
#include <vector>

namespace trident {

// `trident prepare --input PATH... --out PREFIX --data.tokenizer=KIND [--data.tokenizer_path=PATH]
// [--json_key text] [--train_tokenizer VOCAB]`: tokenizes text or JSONL (gzip or not)
// into a Megatron indexed dataset, PREFIX.bin + PREFIX.idx, with a sidecar PREFIX.json.
// Every rank of the job (collective) tokenizes the documents that start in its share
// of the input bytes into a part of its own; the parts are merged in rank order, so
// the dataset's bytes are the same for any rank count. Returns the exit code.
int run_prepare_command(const std::vector<std::string>& args);

}  // namespace trident
