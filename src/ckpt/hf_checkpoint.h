// Hugging Face checkpoints in and out: config.json + model.safetensors, or shards
// model-0000i-of-0000n.safetensors with model.safetensors.index.json, in HF's names and
// layouts (src/model/hf_conventions.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint_format.h"
#include "model/parameters.h"

namespace trident {

struct HfExportOptions {
  std::string dtype = "fp32";  // fp32 | bf16
  double max_shard_gb = 5;     // above it, shards of at most this size (1 GB = 1e9 bytes, as HF counts)
};

struct HfTransfer {
  uint64_t bytes = 0;  // tensor bytes written or read
  int files = 0;       // safetensors files
  double seconds = 0;           // export: writing the safetensors files; import: all of it
  double source_seconds = 0;    // export: reading the checkpoint's tensors first
  // Import: how far this rank's peak resident memory rose above its resident memory at
  // the start (what the import itself needed: slices, not the model).
  uint64_t peak_growth_bytes = 0;
  uint64_t largest_slice_bytes = 0;  // import: the largest shard read, as float32
};

// Writes the parameters of checkpoint `m` into `out_dir`, with the tokenizer's files when
// the run used one (data.tokenizer_path of the checkpoint's config).
HfTransfer export_hf(const Manifest& m, const std::string& out_dir, const HfExportOptions& options);

// Where the Hugging Face form of checkpoint `m` will behave otherwise than the run trained
// (a capacity factor's dropped tokens that HF's dropless experts take; no tokenizer to go
// with the weights), one sentence each for a warning; empty when it behaves the same.
std::vector<std::string> hf_export_caveats(const Manifest& m);

// Initializes this rank's shards from a Hugging Face folder (config.json checked against
// the model: a mismatch is a UsageError naming the field) or one .safetensors file. Each
// tensor's slice is read from the memory-mapped file, so no rank holds a whole model.
HfTransfer import_hf(const ShardedParameters& parameters, const std::string& path);

// True for what import_hf reads: a folder holding config.json or model*.safetensors, or
// a .safetensors file.
bool is_hf_checkpoint(const std::string& path);

}  // namespace trident
