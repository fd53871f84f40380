// Tokenization speed of our tokenizers on one thread, for benchmarks/tokenize_speed.sh
// (which sets them beside tiktoken and spm_encode).
//
//   build/bench/tokenize_speed --text FILE [--gpt2 PATH] [--llama3 PATH] [--sentencepiece MODEL]
//                              [--sp-ids-out FILE] [--min-seconds S]
//
// One line per tokenizer: "ours KIND MB_PER_S TOKENS HASH", MB = 10^6 bytes of text, the
// best of repeated runs (at least 3 and --min-seconds in all), HASH = FNV-1a (32-bit) of the
// ids, to check that the peers produced the same ids. gpt2 and llama3 encode the whole text
// in one call (as the tiktoken run does); sentencepiece encodes it line by line, as
// spm_encode does, and --sp-ids-out writes its ids in spm_encode's --output_format=id form.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "data/tokenizer.h"

using namespace trident;

namespace {

uint32_t fnv(const std::vector<int32_t>& ids, uint32_t h = 2166136261u) {
  for (const int32_t id : ids) {
    h ^= static_cast<uint32_t>(id);
    h *= 16777619u;
  }
  return h;
}

// Best seconds of one call of f.
double best_seconds(const std::function<void()>& f, double min_seconds) {
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 3 || total < min_seconds; rep++) {
    const auto start = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, s);
    total += s;
  }
  return best;
}

std::vector<std::string_view> lines_of(const std::string& text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.emplace_back(text.data() + start, end - start);
    start = end + 1;
  }
  return lines;
}

}  // namespace

int main(int argc, char** argv) {
  std::string text_file, gpt2, llama3, sp_model, sp_ids_out;
  double min_seconds = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--text") text_file = v;
    else if (a == "--gpt2") gpt2 = v;
    else if (a == "--llama3") llama3 = v;
    else if (a == "--sentencepiece") sp_model = v;
    else if (a == "--sp-ids-out") sp_ids_out = v;
    else if (a == "--min-seconds") min_seconds = std::atof(v.c_str());
    else {
      std::fprintf(stderr, "tokenize_speed: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (text_file.empty()) {
    std::fprintf(stderr, "usage: tokenize_speed --text FILE [--gpt2 PATH] [--llama3 PATH] [--sentencepiece MODEL]\n");
    return 2;
  }
  std::ifstream in(text_file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  const double mb = text.size() / 1e6;
  try {
    for (const auto& [kind, path] : {std::pair<std::string, std::string>{"gpt2", gpt2}, {"llama3", llama3}}) {
      if (path.empty()) continue;
      const auto t = make_tokenizer(parse_choice<TokenizerKind>(kind), path);
      std::vector<int32_t> ids;
      const double sec = best_seconds([&] { ids = t->encode(text); }, min_seconds);
      std::printf("ours %s %.3f %zu %u\n", kind.c_str(), mb / sec, ids.size(), fnv(ids));
    }
    if (!sp_model.empty()) {
      const auto t = make_tokenizer(TokenizerKind::sentencepiece, sp_model);
      const std::vector<std::string_view> lines = lines_of(text);
      std::vector<std::vector<int32_t>> ids(lines.size());
      const double sec = best_seconds(
          [&] {
            for (size_t i = 0; i < lines.size(); i++) ids[i] = t->encode(lines[i]);
          },
          min_seconds);
      size_t n = 0;
      uint32_t h = 2166136261u;
      for (const auto& l : ids) {
        n += l.size();
        h = fnv(l, h);
      }
      std::printf("ours sentencepiece %.3f %zu %u\n", mb / sec, n, h);
      if (!sp_ids_out.empty()) {
        std::ofstream out(sp_ids_out);
        for (const auto& l : ids) {
          for (size_t k = 0; k < l.size(); k++) out << (k ? " " : "") << l[k];
          out << "\n";
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenize_speed: %s\n", e.what());
    return 2;
  }
  return 0;
}
