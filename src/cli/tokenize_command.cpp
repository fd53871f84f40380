#include "cli/tokenize_command.h"

#include <boost/program_options.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/config.h"
#include "data/tokenizer.h"
#include "kernels/base/error.h"

namespace po = boost::program_options;

namespace trident {

namespace {

constexpr const char* kTokenizeUsage =
    "usage: trident tokenize --data.tokenizer=KIND [--data.tokenizer_path=PATH] [--config FILE.ini]\n"
    "                        [--add_bos] [--add_eos] [--allow_special] [--decode]\n"
    "  Reads UTF-8 text on stdin and prints its token ids as one JSON array on stdout;\n"
    "  --decode reads such an array and prints the text.\n"
    "  KIND: byte (ids = bytes), gpt2 (PATH: a folder with encoder.json + vocab.bpe, or a .tiktoken\n"
    "  file), llama3 (PATH: Meta's tokenizer.model), sentencepiece (PATH: a .model file).\n";

std::string read_stdin() {
  std::string text;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) text.append(buf, n);
  require(!std::ferror(stdin), "cannot read stdin");
  return text;
}

void write_stdout(const std::string& text) {
  const size_t n = std::fwrite(text.data(), 1, text.size(), stdout);
  check(n == text.size() && std::fflush(stdout) == 0, "cannot write stdout");
}

std::vector<int32_t> parse_ids(const std::string& text, int vocab_size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw UsageError("stdin: expected a JSON array of token ids (tokenize --decode): " + std::string(e.what()));
  }
  require(j.is_array(), "stdin: expected a JSON array of token ids (tokenize --decode), got a JSON " +
                            std::string(j.type_name()));
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (size_t i = 0; i < j.size(); i++) {
    const auto& v = j[i];
    require(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab_size,
            "stdin: element " + std::to_string(i) + " (" + v.dump() + ") is not a token id of this tokenizer (0.." +
                std::to_string(vocab_size - 1) + ")");
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

}  // namespace

int run_tokenize_command(const std::vector<std::string>& args) {
  bool add_bos = false, add_eos = false, allow_special = false, decode = false, help = false;
  po::options_description own("Options of 'trident tokenize'");
  own.add_options()("help,h", po::bool_switch(&help), "show this help")(
      "add_bos", po::bool_switch(&add_bos), "put the tokenizer's bos id first")(
      "add_eos", po::bool_switch(&add_eos), "put the tokenizer's eos id last")(
      "allow_special", po::bool_switch(&allow_special),
      "special-token strings in the text (<|endoftext|>, <|eot_id|>, ...) become their ids")(
      "decode", po::bool_switch(&decode), "read a JSON array of ids, print the text");
  const std::vector<std::string> rest = take_command_options(args, own, kTokenizeUsage);
  if (help) {
    std::ostringstream text;
    text << kTokenizeUsage << "\n" << own;
    std::printf("%s", text.str().c_str());
    return 0;
  }
  // --data.tokenizer, --data.tokenizer_path, --config: the config's own parsing and checks.
  const CommandLine cl = parse_command_line("tokenize", rest);
  const DataConfig& data = cl.config.data;
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(data.tokenizer, data.tokenizer_path);
  const SpecialTokens special = tokenizer->special_tokens();
  require(!add_bos || special.bos >= 0, "--add_bos: the " + tokenizer->kind() + " tokenizer has no bos token");
  require(!add_eos || special.eos >= 0, "--add_eos: the " + tokenizer->kind() + " tokenizer has no eos token");

  const std::string input = read_stdin();
  if (decode) {
    write_stdout(tokenizer->decode(parse_ids(input, tokenizer->vocab_size())));
    return 0;
  }
  std::vector<int32_t> ids;
  if (add_bos) ids.push_back(special.bos);
  try {
    const std::vector<int32_t> body =
        allow_special ? tokenizer->encode_allowing_special(input) : tokenizer->encode(input);
    ids.insert(ids.end(), body.begin(), body.end());
  } catch (const UsageError& e) {
    throw UsageError("stdin: " + std::string(e.what()));
  }
  if (add_eos) ids.push_back(special.eos);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); i++) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  write_stdout(out);
  return 0;
}

}  // namespace trident
