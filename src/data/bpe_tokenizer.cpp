#include "data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "kernels/base/error.h"

namespace fs = std::filesystem;

namespace trident {

// tiktoken tiktoken_ext/openai_public.py (gpt2, r50k_base); meta-llama/llama3 llama/tokenizer.py.
const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// Unicode White_Space, as Rust's regex (tiktoken) and Python's regex module mean \s.
constexpr const char* kWhiteSpaceClass =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();

std::string read_file(const std::string& file, const std::string& what) {
  require(fs::exists(file), what + " '" + file + "' does not exist");
  require(!fs::is_directory(file), what + " '" + file + "' is a directory, expected a file");
  std::ifstream in(file, std::ios::binary);
  require(in.good(), "cannot read " + what + " '" + file + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Strict base64 (RFC 4648, padding required as Python's b64decode wants it); false if not.
bool base64_decode(std::string_view in, std::string& out) {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; i++) t[static_cast<uint8_t>(alphabet[i])] = static_cast<int8_t>(i);
    return t;
  }();
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; k++) {
      const char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        pad++;
      } else {
        if (pad > 0) return false;  // '=' only at the very end
        v[k] = table[static_cast<uint8_t>(c)];
        if (v[k] < 0) return false;
      }
    }
    const uint32_t triple = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out.push_back(static_cast<char>(triple >> 16));
    if (pad < 2) out.push_back(static_cast<char>((triple >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(triple & 0xff));
  }
  return true;
}

// The hash of the rank table: 8 bytes at a time, multiply-xorshift mixing.
inline uint64_t hash_bytes(const uint8_t* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
  }
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return h;
}

// Token bytes -> rank, open addressing, load factor <= 1/2. Pairs of single bytes (the
// first lookups of every merge) come from a direct 64K table.
class RankTable {
 public:
  void build(const std::vector<std::string>& tokens) {
    size_t capacity = 16;
    while (capacity < 2 * tokens.size()) capacity *= 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    size_t bytes = 0;
    for (const std::string& t : tokens) bytes += t.size();
    arena_.resize(bytes);
    pair_.fill(kNoRank);
    byte_.fill(kNoRank);
    size_t offset = 0;
    for (size_t r = 0; r < tokens.size(); r++) {
      const std::string& t = tokens[r];
      std::memcpy(arena_.data() + offset, t.data(), t.size());
      const uint64_t h = hash_bytes(arena_.data() + offset, t.size());
      size_t i = h & mask_;
      while (slots_[i].len != 0) i = (i + 1) & mask_;
      slots_[i] = {static_cast<uint32_t>(h >> 32), static_cast<uint32_t>(r), static_cast<uint32_t>(offset),
                   static_cast<uint32_t>(t.size())};
      if (t.size() == 1) byte_[static_cast<uint8_t>(t[0])] = static_cast<uint32_t>(r);
      if (t.size() == 2) pair_[static_cast<uint8_t>(t[0]) << 8 | static_cast<uint8_t>(t[1])] = static_cast<uint32_t>(r);
      offset += t.size();
    }
  }

  uint32_t find(const uint8_t* p, size_t n) const {
    if (n == 2) return pair_[p[0] << 8 | p[1]];
    if (n == 1) return byte_[p[0]];
    const uint64_t h = hash_bytes(p, n);
    const uint32_t tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.len == 0) return kNoRank;
      if (s.tag == tag && s.len == n && std::memcmp(arena_.data() + s.offset, p, n) == 0) return s.rank;
    }
  }
  uint32_t pair(uint8_t a, uint8_t b) const { return pair_[a << 8 | b]; }
  uint32_t byte(uint8_t b) const { return byte_[b]; }

 private:
  struct Slot {
    uint32_t tag = 0, rank = 0, offset = 0, len = 0;  // len 0: empty
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  std::vector<uint8_t> arena_;
  std::array<uint32_t, 65536> pair_{};
  std::array<uint32_t, 256> byte_{};
};

// Python's str.isspace() (Meta's chunking uses it): White_Space plus U+001C..U+001F.
bool python_isspace(uint32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

uint32_t decode_code_point(std::string_view s, size_t i, int len) {
  const auto b = [&](int k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k])); };
  switch (len) {
    case 1: return b(0);
    case 2: return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3: return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    default: return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
  }
}

// Meta's Llama 3 chunking (llama/tokenizer.py encode): calls of at most 400,000
// characters, each cut further so that no slice holds more than 25,000 consecutive
// space or non-space characters. An invalid UTF-8 byte counts as one non-space character.
template <class F>
void for_each_meta_chunk(std::string_view s, F&& emit) {
  constexpr size_t kMaxChars = 400000, kMaxRun = 25000;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t slice_start = pos, chars = 0, run = 0;
    bool run_is_space = false;
    size_t i = pos;
    while (i < s.size() && chars < kMaxChars) {
      const int len = utf8_sequence_length(s, i);
      const bool space = len > 0 && python_isspace(decode_code_point(s, i, len));
      if (chars == 0) run_is_space = space;
      if (space != run_is_space) {
        run = 1;
        run_is_space = space;
      } else if (++run > kMaxRun) {
        emit(s.substr(slice_start, i - slice_start));
        slice_start = i;
        run = 1;
      }
      i += len > 0 ? len : 1;
      chars++;
    }
    emit(s.substr(slice_start, i - slice_start));
    pos = i;
  }
}

// A compiled pattern; matching needs no lock (match data and JIT stacks are per call).
class Pcre2Pattern {
 public:
  explicit Pcre2Pattern(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                          &error, &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      fail("pcre2_compile of the tokenizer pattern failed at offset " + std::to_string(offset) + ": " +
           reinterpret_cast<const char*>(message));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Pcre2Pattern() { pcre2_code_free(code_); }
  Pcre2Pattern(const Pcre2Pattern&) = delete;
  Pcre2Pattern& operator=(const Pcre2Pattern&) = delete;

  bool jit() const { return jit_; }

  // Calls piece(begin, end) for every match in `s` (valid UTF-8), left to right, as
  // re.finditer does; bytes that no match covers (none with our patterns) are pieces too.
  template <class F>
  void split(std::string_view s, F&& piece) const {
    if (s.empty()) return;
    Matcher m(code_);
    const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0;
    while (pos < s.size()) {
      const int rc = m.match(jit_, subject, s.size(), pos);
      if (rc == PCRE2_ERROR_NOMATCH) {
        piece(pos, s.size());
        return;
      }
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof message);
        fail(std::string("pcre2 match of the tokenizer pattern failed: ") + reinterpret_cast<const char*>(message));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
      size_t begin = ov[0], end = ov[1];
      if (begin > pos) piece(pos, begin);
      if (end == begin) {  // an empty match (not possible with our patterns): step one character
        end = begin + std::max(1, utf8_sequence_length(s, begin));
        end = std::min(end, s.size());
      }
      piece(begin, end);
      pos = end;
    }
  }

 private:
  struct Matcher {
    explicit Matcher(const pcre2_code* c) : code(c), data(pcre2_match_data_create_from_pattern(c, nullptr)) {
      check(data != nullptr, "pcre2_match_data_create failed");
    }
    ~Matcher() {
      pcre2_match_data_free(data);
      if (context != nullptr) pcre2_match_context_free(context);
      if (stack != nullptr) pcre2_jit_stack_free(stack);
    }
    int match(bool jit, PCRE2_SPTR subject, size_t n, size_t pos) {
      for (;;) {
        const int rc = jit ? pcre2_jit_match(code, subject, n, pos, 0, data, context)
                           : pcre2_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK, data, context);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT || stack_size >= (size_t{1} << 30)) return rc;
        // Long runs of one class: a larger JIT stack, and match again.
        stack_size = stack_size == 0 ? (size_t{1} << 20) : stack_size * 8;
        if (stack != nullptr) pcre2_jit_stack_free(stack);
        stack = pcre2_jit_stack_create(32 * 1024, stack_size, nullptr);
        check(stack != nullptr, "pcre2_jit_stack_create failed");
        if (context == nullptr) context = pcre2_match_context_create(nullptr);
        check(context != nullptr, "pcre2_match_context_create failed");
        pcre2_jit_stack_assign(context, nullptr, stack);
      }
    }
    const pcre2_code* code;
    pcre2_match_data* data = nullptr;
    pcre2_match_context* context = nullptr;
    pcre2_jit_stack* stack = nullptr;
    size_t stack_size = 0;
  };

  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// GPT-2's byte <-> unicode map (openai/gpt-2 encoder.py bytes_to_unicode), in tiktoken's
// rank order: rank_to_byte[r] is the byte of single-byte rank r.
struct DataGymBytes {
  std::array<uint8_t, 256> rank_to_byte{};
  std::unordered_map<uint32_t, uint8_t> char_to_byte;  // code point -> byte
  DataGymBytes() {
    int n = 0, r = 0;
    const auto printable = [](int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); };
    for (int b = 0; b < 256; b++)
      if (printable(b)) {
        rank_to_byte[r++] = static_cast<uint8_t>(b);
        char_to_byte[b] = static_cast<uint8_t>(b);
      }
    for (int b = 0; b < 256; b++)
      if (!printable(b)) {
        rank_to_byte[r++] = static_cast<uint8_t>(b);
        char_to_byte[256 + n++] = static_cast<uint8_t>(b);
      }
  }
  // Byte-level-unicode string -> bytes; false if a character is not one of the 256.
  bool decode(std::string_view s, std::string& out) const {
    out.clear();
    for (size_t i = 0; i < s.size();) {
      const int len = utf8_sequence_length(s, i);
      if (len == 0) return false;
      const auto it = char_to_byte.find(decode_code_point(s, i, len));
      if (it == char_to_byte.end()) return false;
      out.push_back(static_cast<char>(it->second));
      i += len;
    }
    return true;
  }
};

std::string printable(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

// Every byte must be a token of its own, or some texts cannot be encoded.
void require_all_bytes(const std::vector<std::string>& tokens, const std::string& file) {
  std::array<bool, 256> seen{};
  for (const std::string& t : tokens)
    if (t.size() == 1) seen[static_cast<uint8_t>(t[0])] = true;
  for (int b = 0; b < 256; b++) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", b);
    require(seen[b], file + ": byte " + hex + " has no token of its own; byte-level BPE needs all 256 bytes");
  }
}

// Calls line(number, text) for every non-empty line of `text` from byte `start` on
// (numbered from `first_number`), without its "\n" or "\r\n".
template <typename F>
void for_each_line(const std::string& text, size_t start, int first_number, F line) {
  for (int number = first_number; start < text.size(); number++) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view l(text.data() + start, end - start);
    start = end + 1;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (!l.empty()) line(number, l);
  }
}

}  // namespace

std::string with_explicit_white_space(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); i++) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[++i];
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpaceClass) : "[" + std::string(kWhiteSpaceClass) + "]";
      } else if (n == 'S') {
        check(!in_class, "\\S inside a character class is not supported");
        out += "[^" + std::string(kWhiteSpaceClass) + "]";
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // a literal ']' first
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

std::vector<std::string> llama3_special_token_names() {
  std::vector<std::string> names = {"<|begin_of_text|>",
                                    "<|end_of_text|>",
                                    "<|reserved_special_token_0|>",
                                    "<|reserved_special_token_1|>",
                                    "<|reserved_special_token_2|>",
                                    "<|reserved_special_token_3|>",
                                    "<|start_header_id|>",
                                    "<|end_header_id|>",
                                    "<|reserved_special_token_4|>",
                                    "<|eot_id|>"};
  for (int i = 5; i < 256 - 5; i++) names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return names;
}

std::vector<std::string> load_tiktoken_ranks(const std::string& file) {
  const std::string text = read_file(file, "tokenizer file");
  std::vector<std::string> by_rank;
  std::vector<int> line_of;  // line of each rank, for messages
  std::unordered_map<std::string, int> line_of_token;
  std::string token;
  for_each_line(text, 0, 1, [&](int line, std::string_view l) {
    const std::string where = file + ":" + std::to_string(line) + ": ";
    const size_t space = l.find(' ');
    require(space != std::string_view::npos && l.find(' ', space + 1) == std::string_view::npos,
            where + "expected 'base64 rank' (a .tiktoken rank file), got '" + printable(l.substr(0, 80)) + "'");
    const std::string_view b64 = l.substr(0, space), rank_text = l.substr(space + 1);
    require(base64_decode(b64, token), where + "'" + printable(b64.substr(0, 80)) + "' is not base64");
    require(!token.empty(), where + "empty token");
    require(!rank_text.empty() && rank_text.size() <= 9 &&
                std::all_of(rank_text.begin(), rank_text.end(), [](char c) { return c >= '0' && c <= '9'; }),
            where + "rank '" + printable(rank_text.substr(0, 20)) + "' is not a number below 10^9");
    const size_t rank = std::stoul(std::string(rank_text));
    if (rank >= by_rank.size()) {
      by_rank.resize(rank + 1);
      line_of.resize(rank + 1, 0);
    }
    require(line_of[rank] == 0,
            where + "rank " + std::to_string(rank) + " given again (first on line " + std::to_string(line_of[rank]) + ")");
    const auto [it, fresh] = line_of_token.emplace(token, line);
    require(fresh, where + "token '" + printable(token) + "' given again (first on line " + std::to_string(it->second) + ")");
    by_rank[rank] = token;
    line_of[rank] = line;
  });
  require(!by_rank.empty(), file + ": no ranks (expected a .tiktoken file: one 'base64 rank' line per token)");
  for (size_t r = 0; r < by_rank.size(); r++)
    require(line_of[r] != 0, file + ": rank " + std::to_string(r) + " is missing (ranks must run 0.." +
                                 std::to_string(by_rank.size() - 1) + ")");
  require_all_bytes(by_rank, file);
  return by_rank;
}

std::vector<std::string> load_gpt2_data_gym(const std::string& dir, int32_t* endoftext) {
  const std::string vocab_file = (fs::path(dir) / "vocab.bpe").string();
  const std::string encoder_file = (fs::path(dir) / "encoder.json").string();
  const std::string vocab = read_file(vocab_file, "GPT-2 merges file");
  const std::string encoder_text = read_file(encoder_file, "GPT-2 vocabulary file");
  static const DataGymBytes bytes;

  std::vector<std::string> tokens;
  for (uint8_t b : bytes.rank_to_byte) tokens.emplace_back(1, static_cast<char>(b));
  std::unordered_map<std::string, uint32_t> rank_of;
  for (uint32_t r = 0; r < tokens.size(); r++) rank_of[tokens[r]] = r;

  // Line 1 is "#version: 0.2"; then one merge "A B" per line (openai/gpt-2 get_encoder).
  const size_t header_end = vocab.find('\n');
  require(header_end != std::string::npos && vocab.starts_with("#version"),
          vocab_file + ":1: expected '#version: 0.2' (GPT-2's vocab.bpe)");
  std::string first, second;
  for_each_line(vocab, header_end + 1, 2, [&](int line, std::string_view l) {
    const std::string where = vocab_file + ":" + std::to_string(line) + ": ";
    const size_t space = l.find(' ');
    require(space != std::string_view::npos && space > 0 && space + 1 < l.size() &&
                l.find(' ', space + 1) == std::string_view::npos,
            where + "expected a merge 'A B' of two byte-level tokens, got '" + printable(l.substr(0, 80)) + "'");
    require(bytes.decode(l.substr(0, space), first) && bytes.decode(l.substr(space + 1), second),
            where + "'" + printable(l.substr(0, 80)) + "' holds a character that is not one of GPT-2's 256 byte characters");
    const std::string merged = first + second;
    const auto [it, fresh] = rank_of.emplace(merged, static_cast<uint32_t>(tokens.size()));
    require(fresh, where + "the merge gives token '" + printable(merged) + "' again (rank " + std::to_string(it->second) + ")");
    tokens.push_back(merged);
  });

  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(encoder_text);
  } catch (const nlohmann::json::parse_error& e) {
    const size_t at = std::min<size_t>(e.byte, encoder_text.size());
    const auto line = 1 + std::count(encoder_text.begin(), encoder_text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
    throw UsageError(encoder_file + ":" + std::to_string(line) + ": not valid JSON (byte " + std::to_string(e.byte) +
                     "): " + e.what());
  }
  require(encoder.is_object(), encoder_file + ":1: expected a JSON object of token -> id (GPT-2's encoder.json)");
  *endoftext = -1;
  size_t checked = 0;
  std::string decoded;
  for (const auto& [key, value] : encoder.items()) {
    require(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < (int64_t{1} << 30),
            encoder_file + ": entry \"" + printable(key) + "\" has no valid id");
    const auto id = value.get<int32_t>();
    if (key == "<|endoftext|>") {
      *endoftext = id;
      continue;
    }
    if (key == "<|startoftext|>") continue;
    require(bytes.decode(key, decoded),
            encoder_file + ": entry \"" + printable(key) + "\" holds a character that is not one of GPT-2's 256 byte characters");
    const auto it = rank_of.find(decoded);
    require(it != rank_of.end(), encoder_file + ": entry \"" + printable(key) + "\" (id " + std::to_string(id) +
                                     ") is not a token of " + vocab_file);
    require(it->second == static_cast<uint32_t>(id),
            encoder_file + ": entry \"" + printable(key) + "\" has id " + std::to_string(id) + " but " + vocab_file +
                " gives it rank " + std::to_string(it->second) + " (the two files do not belong together)");
    checked++;
  }
  require(checked == tokens.size(), encoder_file + " has " + std::to_string(checked) + " tokens but " + vocab_file +
                                        " makes " + std::to_string(tokens.size()) +
                                        " (the two files do not belong together)");
  require(*endoftext >= 0, encoder_file + " has no <|endoftext|> entry");
  require(*endoftext >= static_cast<int32_t>(tokens.size()),
          encoder_file + ": <|endoftext|> has id " + std::to_string(*endoftext) + ", which is a merge rank");
  return tokens;
}

// ---- the engine ---------------------------------------------------------------------

struct BpeTokenizer::Impl {
  BpeOptions options;
  RankTable ranks;
  size_t n_ranks = 0;
  int vocab_size = 0;
  std::unique_ptr<Pcre2Pattern> pattern;
  // id -> bytes: offsets[id] .. offsets[id + 1] in bytes (specials included; unused ids empty)
  std::vector<uint32_t> offsets;
  std::string bytes;
  std::vector<bool> is_id;
  std::unordered_map<std::string, int32_t> specials;

  // Appends the tokens of one piece.
  void encode_piece(const uint8_t* p, size_t n, std::vector<int32_t>& out) const {
    if (n == 0) return;
    if (n == 1) {
      out.push_back(static_cast<int32_t>(ranks.byte(p[0])));
      return;
    }
    const uint32_t whole = ranks.find(p, n);
    if (whole != kNoRank) {
      out.push_back(static_cast<int32_t>(whole));
      return;
    }
    if (n <= 128)
      merge_small(p, n, out);
    else
      merge_large(p, n, out);
  }

  // tiktoken's _byte_pair_merge: parts (start, rank of the pair starting there), the
  // lowest rank merged (the leftmost of equal ranks), O(n m).
  void merge_small(const uint8_t* p, size_t n, std::vector<int32_t>& out) const {
    uint32_t start[130], rank[130];
    size_t m = 0;
    uint32_t min_rank = kNoRank;
    size_t min_i = 0;
    for (size_t i = 0; i + 1 < n; i++) {
      const uint32_t r = ranks.pair(p[i], p[i + 1]);
      if (r < min_rank) {
        min_rank = r;
        min_i = i;
      }
      start[m] = static_cast<uint32_t>(i);
      rank[m++] = r;
    }
    start[m] = static_cast<uint32_t>(n - 1);
    rank[m++] = kNoRank;
    start[m] = static_cast<uint32_t>(n);
    rank[m++] = kNoRank;
    // The rank of parts i and i+1 merged, with part i+1 still in place (hence i+3).
    const auto get_rank = [&](size_t i) {
      return i + 3 < m ? ranks.find(p + start[i], start[i + 3] - start[i]) : kNoRank;
    };
    while (min_rank != kNoRank) {
      const size_t i = min_i;
      if (i > 0) rank[i - 1] = get_rank(i - 1);
      rank[i] = get_rank(i);
      std::memmove(start + i + 1, start + i + 2, (m - i - 2) * sizeof(uint32_t));
      std::memmove(rank + i + 1, rank + i + 2, (m - i - 2) * sizeof(uint32_t));
      m--;
      min_rank = kNoRank;
      for (size_t k = 0; k + 1 < m; k++)
        if (rank[k] < min_rank) {
          min_rank = rank[k];
          min_i = k;
        }
    }
    for (size_t k = 0; k + 1 < m; k++) out.push_back(static_cast<int32_t>(ranks.find(p + start[k], start[k + 1] - start[k])));
  }

  // The same merges with a heap of (rank, position) over a linked list of parts: the
  // popped minimum is the lowest rank and, among equal ranks, the leftmost, as above.
  void merge_large(const uint8_t* p, size_t n, std::vector<int32_t>& out) const {
    // Part k starts at byte start[k]; parts are never created, only absorbed into their left
    // neighbour, so positions order as the parts do. Node n is the end sentinel.
    std::vector<uint32_t> next(n + 1), prev(n + 1), pair_rank(n + 1, kNoRank);
    for (size_t k = 0; k <= n; k++) {
      next[k] = static_cast<uint32_t>(k + 1);
      prev[k] = static_cast<uint32_t>(k == 0 ? 0 : k - 1);
    }
    const auto rank_of_pair = [&](uint32_t k) -> uint32_t {  // part k merged with its successor
      const uint32_t j = next[k];
      if (j >= n) return kNoRank;
      return ranks.find(p + k, next[j] - k);
    };
    using Entry = uint64_t;  // rank << 32 | position
    std::vector<Entry> heap;
    heap.reserve(n);
    for (uint32_t k = 0; k + 1 < n; k++) {
      pair_rank[k] = ranks.pair(p[k], p[k + 1]);
      if (pair_rank[k] != kNoRank) heap.push_back(Entry{pair_rank[k]} << 32 | k);
    }
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue(std::greater<Entry>(), std::move(heap));
    std::vector<bool> alive(n + 1, true);
    while (!queue.empty()) {
      const Entry e = queue.top();
      queue.pop();
      const auto k = static_cast<uint32_t>(e & 0xffffffffu);
      const auto r = static_cast<uint32_t>(e >> 32);
      if (!alive[k] || pair_rank[k] != r) continue;  // stale
      const uint32_t j = next[k];
      alive[j] = false;
      next[k] = next[j];
      prev[next[j]] = k;
      pair_rank[j] = kNoRank;
      pair_rank[k] = rank_of_pair(k);
      if (pair_rank[k] != kNoRank) queue.push(Entry{pair_rank[k]} << 32 | k);
      if (k > 0) {
        const uint32_t left = prev[k];
        pair_rank[left] = rank_of_pair(left);
        if (pair_rank[left] != kNoRank) queue.push(Entry{pair_rank[left]} << 32 | left);
      }
    }
    for (uint32_t k = 0; k < n; k = next[k]) out.push_back(static_cast<int32_t>(ranks.find(p + k, next[k] - k)));
  }

  // The pieces of a text without special tokens, as byte ranges piece(begin, end) of it:
  // cut at invalid UTF-8 (each run of invalid bytes one piece), the rest split by the
  // pattern.
  template <class Piece>
  void for_each_plain_piece(std::string_view s, Piece&& piece) const {
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t bad = first_invalid_utf8(s.substr(pos));
      const size_t valid_end = bad == std::string_view::npos ? s.size() : pos + bad;
      if (valid_end > pos)
        pattern->split(s.substr(pos, valid_end - pos), [&](size_t b, size_t e) { piece(pos + b, pos + e); });
      if (valid_end == s.size()) break;
      size_t bad_end = valid_end + 1;
      while (bad_end < s.size() && utf8_sequence_length(s, bad_end) == 0) bad_end++;
      piece(valid_end, bad_end);
      pos = bad_end;
    }
  }

  // A text without special tokens, its pieces merged.
  void encode_plain(std::string_view s, std::vector<int32_t>& out) const {
    const auto base = reinterpret_cast<const uint8_t*>(s.data());
    for_each_plain_piece(s, [&](size_t b, size_t e) { encode_piece(base + b, e - b, out); });
  }

  // The same cuts as encode_plain, as pieces.
  void pieces_plain(std::string_view s, std::vector<std::string>& out) const {
    for_each_plain_piece(s, [&](size_t b, size_t e) { out.emplace_back(s.substr(b, e - b)); });
  }

  // Calls plain(segment) for the text between special tokens and special(id) for each.
  template <class Plain, class Special>
  void split_specials(std::string_view s, Plain&& plain, Special&& special) const {
    size_t start = 0, search = 0;
    while (true) {
      const size_t open = s.find("<|", search);
      if (open == std::string_view::npos) break;
      const size_t close = s.find("|>", open + 2);
      if (close == std::string_view::npos) break;
      const auto it = specials.find(std::string(s.substr(open, close + 2 - open)));
      if (it == specials.end()) {
        search = open + 1;
        continue;
      }
      plain(s.substr(start, open - start));
      special(it->second);
      start = search = close + 2;
    }
    plain(s.substr(start));
  }

  template <class F>
  void for_each_call(std::string_view s, F&& f) const {
    if (options.meta_chunking)
      for_each_meta_chunk(s, f);
    else
      f(s);
  }
};

BpeTokenizer::BpeTokenizer(std::vector<std::string> tokens, std::vector<std::pair<std::string, int32_t>> specials,
                           BpeOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  m.n_ranks = tokens.size();
  m.ranks.build(tokens);
  m.pattern = std::make_unique<Pcre2Pattern>(m.options.pattern);
  int32_t max_id = static_cast<int32_t>(tokens.size()) - 1;
  for (const auto& [name, id] : specials) {
    check(id >= static_cast<int32_t>(tokens.size()), "special token " + name + " takes a merge rank");
    max_id = std::max(max_id, id);
    m.specials[name] = id;
  }
  m.vocab_size = max_id + 1;
  std::vector<std::string> by_id(m.vocab_size);
  m.is_id.assign(m.vocab_size, false);
  for (size_t r = 0; r < tokens.size(); r++) {
    by_id[r] = std::move(tokens[r]);
    m.is_id[r] = true;
  }
  for (const auto& [name, id] : specials) {
    by_id[id] = name;
    m.is_id[id] = true;
  }
  m.offsets.resize(m.vocab_size + 1);
  for (int i = 0; i < m.vocab_size; i++) {
    m.offsets[i] = static_cast<uint32_t>(m.bytes.size());
    m.bytes += by_id[i];
  }
  m.offsets[m.vocab_size] = static_cast<uint32_t>(m.bytes.size());
}

BpeTokenizer::~BpeTokenizer() = default;

std::string BpeTokenizer::kind() const { return impl_->options.kind; }
int BpeTokenizer::vocab_size() const { return impl_->vocab_size; }
SpecialTokens BpeTokenizer::special_tokens() const { return impl_->options.special; }

std::string BpeTokenizer::describe() const {
  return impl_->options.kind + ": byte-level BPE (tiktoken), " + std::to_string(impl_->n_ranks) + " ranks + " +
         std::to_string(impl_->specials.size()) + " special tokens = vocabulary " + std::to_string(impl_->vocab_size) +
         ", from " + impl_->options.source + (impl_->pattern->jit() ? "" : " (PCRE2 without JIT)");
}

void BpeTokenizer::encode_ordinary_into(std::string_view text, std::vector<int32_t>& out) const {
  impl_->for_each_call(text, [&](std::string_view chunk) { impl_->encode_plain(chunk, out); });
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  encode_ordinary_into(text, out);
  return out;
}

std::vector<int32_t> BpeTokenizer::encode_allowing_special(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  impl_->for_each_call(text, [&](std::string_view chunk) {
    impl_->split_specials(
        chunk, [&](std::string_view plain) { impl_->encode_plain(plain, out); },
        [&](int32_t id) { out.push_back(id); });
  });
  return out;
}

std::vector<std::string> BpeTokenizer::pieces(std::string_view text) const {
  std::vector<std::string> out;
  impl_->for_each_call(text, [&](std::string_view chunk) { impl_->pieces_plain(chunk, out); });
  return out;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  const Impl& m = *impl_;
  std::string out;
  size_t n = 0;
  for (size_t i = 0; i < ids.size(); i++) {
    const int32_t id = ids[i];
    if (id < 0 || id >= m.vocab_size || !m.is_id[id])  // the message only on failure (this runs per token)
      throw UsageError("token id " + std::to_string(id) + " (position " + std::to_string(i) + ") is not in the " +
                       m.options.kind + " vocabulary (0.." + std::to_string(m.vocab_size - 1) + ")");
    n += m.offsets[id + 1] - m.offsets[id];
  }
  out.reserve(n);
  for (const int32_t id : ids) out.append(m.bytes, m.offsets[id], m.offsets[id + 1] - m.offsets[id]);
  return out;
}

std::unique_ptr<BpeTokenizer> make_gpt2_tokenizer(const std::string& path) {
  require(!path.empty(), "data.tokenizer=gpt2 needs data.tokenizer_path: a folder with encoder.json and vocab.bpe, "
                         "or a .tiktoken file (r50k_base.tiktoken)");
  require(fs::exists(path), "data.tokenizer_path '" + path + "' does not exist");
  std::vector<std::string> tokens;
  int32_t endoftext = 0;
  std::string source;
  if (fs::is_directory(path)) {
    tokens = load_gpt2_data_gym(path, &endoftext);
    source = (fs::path(path) / "{encoder.json,vocab.bpe}").string();
  } else {
    tokens = load_tiktoken_ranks(path);
    endoftext = static_cast<int32_t>(tokens.size());  // r50k_base: 50256, after the ranks
    source = path;
  }
  BpeOptions o;
  o.kind = "gpt2";
  o.pattern = with_explicit_white_space(kGpt2Pattern);
  o.special = {endoftext, endoftext, endoftext};
  o.source = source;
  return std::make_unique<BpeTokenizer>(std::move(tokens), std::vector<std::pair<std::string, int32_t>>{{"<|endoftext|>", endoftext}},
                                        std::move(o));
}

std::unique_ptr<BpeTokenizer> make_llama3_tokenizer(const std::string& path) {
  require(!path.empty(), "data.tokenizer=llama3 needs data.tokenizer_path: Meta's tokenizer.model (a .tiktoken file)");
  require(fs::exists(path), "data.tokenizer_path '" + path + "' does not exist");
  const std::string file = fs::is_directory(path) ? (fs::path(path) / "tokenizer.model").string() : path;
  std::vector<std::string> tokens = load_tiktoken_ranks(file);
  const auto base = static_cast<int32_t>(tokens.size());  // 128000: num_base_tokens
  std::vector<std::pair<std::string, int32_t>> specials;
  const std::vector<std::string> names = llama3_special_token_names();
  for (size_t i = 0; i < names.size(); i++) specials.emplace_back(names[i], base + static_cast<int32_t>(i));
  BpeOptions o;
  o.kind = "llama3";
  o.pattern = with_explicit_white_space(kLlama3Pattern);
  o.meta_chunking = true;
  o.special = {base, base + 1, base + 9};  // <|begin_of_text|>, <|end_of_text|>, <|eot_id|>
  o.source = file;
  return std::make_unique<BpeTokenizer>(std::move(tokens), std::move(specials), std::move(o));
}

}  // namespace trident
