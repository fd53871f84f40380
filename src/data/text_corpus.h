// The training text as byte-level tokens (ids 0..255), split into documents and into
// train and validation parts, and the deterministic batch sampler over it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trident {

struct TextCorpus {
  std::vector<uint8_t> train;  // tokens of the training documents, in order
  std::vector<uint8_t> val;    // tokens of the held-out documents (the last ones)
  size_t documents = 0, files = 0;

  // Entropy in nats of the byte distribution of the training tokens: the loss of the
  // best model that ignores context, which training must get well below.
  double unigram_entropy() const;
};

// Reads `path` (a text file, or every plain file of a directory in name order, skipping
// the strfile indexes *.dat and the *.u8 copies that Debian's fortunes ships). Documents
// are separated by lines holding only '%', or are whole files. The last val_fraction
// of the documents (at least one when val_fraction > 0) form the validation split.
TextCorpus load_text_corpus(const std::string& path, double val_fraction);

// Sequences of T+1 tokens (inputs [:T], targets [1:]) drawn from a token array. The
// start of sequence i of step s depends only on (seed, split, s, i), so the global
// batch of a step is the same under every layout and after any resume.
class BatchSampler {
 public:
  BatchSampler(const std::vector<uint8_t>& tokens, int seq_len, uint64_t seed, uint64_t stream);

  // Sequences [first, first + count) of step `step`, as inputs and targets [count, T].
  void fill(int64_t step, int first, int count, std::vector<int32_t>& inputs,
            std::vector<int32_t>& targets) const;

 private:
  const std::vector<uint8_t>& tokens_;
  int T_;
  uint64_t seed_, stream_;
};

}  // namespace trident
