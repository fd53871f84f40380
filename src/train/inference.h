// A trained model put to use, under any layout: the loss on a split of the data
// (`trident eval`, cli/eval_command.h) and text from a prompt (`trident generate`,
// cli/generate_command.h, and the samples training prints). Each rank runs the same
// sequence; the logits come from the last pipeline stage (model/transformer.h),
// gathered over tp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/token_dataset.h"
#include "parallel/parallel_state.h"
#include "train/step_runner.h"

namespace trident {

struct SamplingSettings {
  int max_tokens = 64;
  double temperature = 0;  // 0: greedy (the most likely token, the lowest id on a tie)
  int top_k = 0;           // 0: the whole vocabulary
  uint64_t seed = 1;
};

// The next token from logits: greedy, or drawn from softmax(logits / temperature) over
// the top_k, with a random number that depends on (seed, draw) only, so every rank
// draws the same token.
int32_t sample_token(const std::vector<float>& logits, const SamplingSettings& s, uint64_t draw);

// Continues `prompt` by up to max_tokens tokens (stopping after `stop` when >= 0), the
// last seq_len tokens as the context. Collective: every rank returns the same tokens.
std::vector<int32_t> generate_tokens(StepRunner& runner, const std::vector<int32_t>& prompt, int seq_len,
                                     const SamplingSettings& s, int32_t stop);

// Mean loss per token over the split's non-overlapping windows of seq_len + 1 tokens
// (every window, or the first max_sequences of each dataset), each dp rank taking its
// share: the same number under every layout. Collective.
struct EvalResult {
  double loss = 0;
  uint64_t sequences = 0, tokens = 0;
};
EvalResult evaluate_split(StepRunner& runner, const Split& split, int seq_len, ParallelState& parallel,
                          uint64_t max_sequences);

// Text for one log line: newlines and tabs escaped, other control characters '?'.
std::string printable(const std::string& text);

}  // namespace trident
