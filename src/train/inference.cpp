#include "train/inference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/base/error.h"
#include "runtime/random.h"

namespace trident {

std::string printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 32) out += '?';
    else out += static_cast<char>(c);
  }
  return out;
}

int32_t sample_token(const std::vector<float>& logits, const SamplingSettings& s, uint64_t draw) {
  const int V = static_cast<int>(logits.size());
  if (s.temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  const int k = s.top_k > 0 ? std::min(s.top_k, V) : V;
  // The k most likely, ties to the lower id, so every rank orders them alike.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<double> p(k);
  const double top = logits[order[0]];
  double sum = 0;
  for (int i = 0; i < k; i++) sum += p[i] = std::exp((logits[order[i]] - top) / s.temperature);
  const double u = uniform_open(hash_key(s.seed, 0x73616d706c65ull, draw)) * sum;  // "sample"
  double cumulative = 0;
  for (int i = 0; i < k; i++)
    if (u < (cumulative += p[i])) return order[i];
  return order[k - 1];
}

std::vector<int32_t> generate_tokens(StepRunner& runner, const std::vector<int32_t>& prompt, int seq_len,
                                     const SamplingSettings& s, int32_t stop) {
  check(!prompt.empty(), "generate: an empty prompt");
  std::vector<int32_t> text = prompt, generated, window(seq_len);
  for (int i = 0; i < s.max_tokens; i++) {
    // The last seq_len tokens; causal attention leaves the padding after them unread.
    const size_t n = std::min<size_t>(text.size(), seq_len);
    std::fill(window.begin(), window.end(), 0);
    std::copy(text.end() - n, text.end(), window.begin());
    const int32_t next = sample_token(runner.next_token_logits(window.data(), static_cast<int>(n) - 1), s, i);
    generated.push_back(next);
    text.push_back(next);
    if (next == stop) break;
  }
  return generated;
}

EvalResult evaluate_split(StepRunner& runner, const Split& split, int seq_len, ParallelState& parallel,
                          uint64_t max_sequences) {
  // The windows: [begin + w T, begin + w T + T + 1) of each range, in order.
  struct Window {
    const TokenRange* range;
    uint64_t start;
  };
  std::vector<Window> windows;
  for (const TokenRange& r : split.ranges) {
    uint64_t count = r.size() > 0 ? (r.size() - 1) / seq_len : 0;
    if (max_sequences > 0) count = std::min(count, max_sequences);
    for (uint64_t w = 0; w < count; w++) windows.push_back({&r, r.begin + w * seq_len});
  }
  require(!windows.empty(), "the split holds no sequence of " + std::to_string(seq_len + 1) + " tokens");
  const int dp = parallel.size(Axis::dp), rank = parallel.coord(Axis::dp);
  std::vector<int32_t> buffer(seq_len + 1);
  double sum = 0;
  for (size_t first = 0; first < windows.size(); first += dp) {
    // Rank r takes window first + r; past the end it runs window 0 unweighted, so that
    // every rank of its tp and pp groups takes part in every forward.
    const size_t mine = first + rank;
    const Window& w = windows[mine < windows.size() ? mine : 0];
    w.range->dataset->read(w.start, seq_len + 1, buffer.data());
    const double loss = runner.forward_loss(buffer.data(), buffer.data() + 1, 1);
    if (mine < windows.size()) sum += loss * seq_len;
  }
  if (parallel.size(Axis::pp) > 1) sum = parallel.pp().all_reduce(sum);
  sum = parallel.dp().all_reduce(sum);
  EvalResult r;
  r.sequences = windows.size();
  r.tokens = windows.size() * static_cast<uint64_t>(seq_len);
  r.loss = sum / static_cast<double>(r.tokens);
  return r;
}

}  // namespace trident
