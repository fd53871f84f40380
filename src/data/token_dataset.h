// What training reads: one stream of token ids, cut into documents, from any of the
// formats users bring (data.path):
//   - a Megatron indexed-dataset prefix (<prefix>.bin + <prefix>.idx, memory-mapped);
//   - llm.c .bin shards, a glob (GPT-2's uint16 and Llama 3's uint32 headers), shards
//     named *_val_* being the validation split as llm.c writes them;
//   - text: a file or a folder (documents split at lines holding only '%', or one per
//     file), tokenized at start with data.tokenizer (bytes by default);
//   - a blend, Megatron's weighted form: "0.7 web 0.3 code".
// A split (train or validation) is a token range of each dataset, cut at a document
// start; the batch sampler draws sequences from it as a function of (seed, step) alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace trident {

class Tokenizer;
class TokenBytes;

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  virtual uint64_t tokens() const = 0;
  // count tokens from token offset `begin`.
  virtual void read(uint64_t begin, size_t count, int32_t* out) const = 0;
  // The token ranges (begin, count) about to be read: a remote dataset fetches them
  // together (data.stream); nothing by default.
  virtual void prefetch(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const { (void)ranges; }
  // The same for ranges read later (the next step's), fetched in the background meanwhile.
  virtual void prefetch_in_background(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const { (void)ranges; }
  // What reading it cost, for the log ("" for local data).
  virtual std::string traffic() const { return ""; }
  // Read over the network as needed (data.stream): a pass over it is not cheap.
  virtual bool streamed() const { return false; }
  // Token offsets where documents start, ascending, from 0.
  virtual const std::vector<uint64_t>& document_starts() const = 0;
  // The largest token id; -1 where unknown (a streamed dataset is not read whole).
  virtual int64_t max_token() const = 0;
  // "Megatron indexed dataset web (uint16): 1234 documents, 5678 tokens"
  virtual std::string describe() const = 0;
  // Identifies the data (paths, sizes, a hash of the index): what a checkpoint records.
  virtual std::string fingerprint() const = 0;
};

// Tokens held in memory (tokenized text), with their document starts.
std::unique_ptr<TokenDataset> in_memory_dataset(std::vector<int32_t> tokens, std::vector<uint64_t> document_starts,
                                                std::string description, std::string fingerprint);
std::unique_ptr<TokenDataset> open_megatron_dataset(const std::string& prefix);
// The same from its index's bytes and its tokens' source (data/s3_stream.h); `name` is
// where it is (s3://bucket/prefix).
std::unique_ptr<TokenDataset> open_megatron_dataset(const std::string& name, const std::string& idx,
                                                    std::unique_ptr<TokenBytes> bin);
// All shards matching `glob_pattern`, in name order, as one stream.
std::unique_ptr<TokenDataset> open_llmc_shards(const std::vector<std::string>& files);
// A text file or folder, tokenized with `tokenizer` (documents separated by its
// end-of-document token when it has one, else kept as the text had them). JSONL files
// (.jsonl, .json, gzipped or not) hold a document per line under `json_key`, as
// `trident prepare` reads them.
std::unique_ptr<TokenDataset> open_text_dataset(const std::string& path, const Tokenizer& tokenizer,
                                                const std::string& json_key = "text");

// A contiguous token range of one dataset.
struct TokenRange {
  const TokenDataset* dataset = nullptr;
  uint64_t begin = 0, end = 0;
  uint64_t size() const { return end - begin; }
};

// The ranges sequences are drawn from, with their blend weights (summing to 1).
struct Split {
  std::vector<TokenRange> ranges;
  std::vector<double> weights;
  uint64_t tokens() const;
};

// Work that goes on while the data is read: the copies of s3:// token files a node leader
// makes during training (data/s3_data.h). Destroyed with the data: what is not done then is
// cancelled.
class DataInBackground {
 public:
  virtual ~DataInBackground() = default;
  virtual void start() = 0;  // once; a no-op after that
  virtual void wait() = 0;   // starts it if not yet, and returns when it is done (or failed)
};

// What data.path names, opened: the datasets, the train and validation splits, and
// what the log and the checkpoints say about it.
struct TrainingData {
  std::vector<std::unique_ptr<TokenDataset>> datasets;
  std::shared_ptr<DataInBackground> background;  // null: nothing
  Split train, val;
  size_t documents = 0, files = 0;
  int64_t max_token = 0;
  std::string description, fingerprint;
  // Entropy in nats of the token distribution of (a sample of) the training split: the
  // loss of the best model that ignores context.
  double unigram_entropy = 0;
};

// Opens data.path (any form above). The validation split: data.val_path when given (all
// of it), else llm.c's *_val_* shards, else the last val_fraction of each dataset's
// documents (at least one when val_fraction > 0). UsageError naming the file and what
// is wrong.
// An entry given as s3://... is opened with `open_remote` (data.stream: data/s3_data.h).
using RemoteOpener = std::function<std::unique_ptr<TokenDataset>(const std::string& uri)>;
TrainingData open_training_data(const std::string& path, const std::string& val_path, double val_fraction,
                                const Tokenizer& tokenizer, const std::string& json_key = "text",
                                const RemoteOpener& open_remote = {});

// UsageError unless the data fits the model: every token id a row of the embedding (below
// vocab_size; the tokenizer's vocabulary may be larger: pre-tokenized data whose ids all
// fit trains), and sequences of seq_len + 1 tokens to draw from the training split.
void require_data_fits(const TrainingData& data, int vocab_size, int seq_len);

// Sequences of T+1 tokens (inputs [:T], targets [1:]) drawn from a split. Sequence i of
// step s comes from the blend's dataset and start chosen by (seed, stream, s, i) alone,
// so the global batch of a step is the same under every layout and after any resume.
class BatchSampler {
 public:
  BatchSampler(const Split& split, int seq_len, uint64_t seed, uint64_t stream);

  // Sequences [first, first + count) of step `step`, as inputs and targets [count, T].
  void fill(int64_t step, int first, int count, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const;
  // Those of a later step, fetched in the background meanwhile where the data is streamed
  // (nothing otherwise): the step that fills them then finds them there.
  void prefetch(int64_t step, int first, int count) const;

 private:
  const Split& split_;
  int T_;
  uint64_t seed_, stream_;
  bool streamed_ = false;  // some dataset is read over the network: batches are fetched ahead
  mutable std::vector<int32_t> window_;
  // Where sequences [first, first + count) of `step` start, in which dataset.
  std::vector<std::pair<const TokenDataset*, uint64_t>> starts(int64_t step, int first, int count) const;
  // Their token ranges, asked of each dataset (fetched now, or in the background).
  void prefetch(const std::vector<std::pair<const TokenDataset*, uint64_t>>& at, bool in_background) const;
};

}  // namespace trident
