#include "ckpt/hf_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "ckpt/safetensors.h"
#include "data/tokenizer.h"
#include "model/hf_conventions.h"
#include "kernels/base/error.h"
#include "kernels/base/memory.h"
#include "runtime/timer.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

// A [rows, columns] tensor as HF stores a Conv1D weight: [columns, rows].
std::vector<float> transposed(const std::vector<float>& a, int64_t rows, int64_t columns) {
  std::vector<float> t(a.size());
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < columns; c++) t[c * rows + r] = a[r * columns + c];
  return t;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  require(in.good(), "cannot read '" + path.string() + "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path.string() + ": not JSON: " + e.what());
  }
}

void write_json(const fs::path& path, const nlohmann::ordered_json& j) {
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(2) << "\n";
  require(out.good(), "cannot write '" + path.string() + "'");
}

}  // namespace

namespace {

// What Hugging Face reads besides the weights to use the run's tokenizer right: the
// special tokens' ids in config.json and generation_config.json (else HF's defaults
// apply: Llama's 1 and 2, whatever the tokenizer), and tokenizer_config.json naming the
// tokenizer class and its special tokens, as transformers' save_pretrained writes them.
// Byte-level tokens have no HF tokenizer, and a Llama 3 .tiktoken file no HF class that
// reads it as it is: their tokenizer_config.json is left out.
void write_hf_tokenizer_config(const fs::path& out_dir, const DataConfig& data, int seq_len,
                               nlohmann::ordered_json& config) {
  SpecialTokens special;
  try {
    special = make_tokenizer(data.tokenizer, data.tokenizer_path)->special_tokens();
  } catch (const UsageError&) {
    return;  // its files are gone from where the run read them: the weights go without
  }
  nlohmann::ordered_json generation = {{"_from_model_config", true}};
  if (special.bos >= 0) config["bos_token_id"] = generation["bos_token_id"] = special.bos;
  if (special.eos >= 0) config["eos_token_id"] = special.eos;
  // Generation stops at the end of a document, and (Llama 3) at the end of a turn.
  if (special.eos >= 0)
    generation["eos_token_id"] = special.eot >= 0 && special.eot != special.eos
                                     ? nlohmann::ordered_json({special.eos, special.eot})
                                     : nlohmann::ordered_json(special.eos);
  write_json(out_dir / "generation_config.json", generation);
  nlohmann::ordered_json t;
  if (data.tokenizer == TokenizerKind::gpt2 && fs::is_directory(data.tokenizer_path)) {
    t = {{"tokenizer_class", "GPT2Tokenizer"},  {"bos_token", "<|endoftext|>"}, {"eos_token", "<|endoftext|>"},
         {"unk_token", "<|endoftext|>"},        {"add_bos_token", false},        {"add_prefix_space", false},
         {"errors", "replace"},                 {"model_max_length", seq_len},  {"clean_up_tokenization_spaces", false}};
  } else if (data.tokenizer == TokenizerKind::sentencepiece) {
    t = {{"tokenizer_class", "LlamaTokenizer"}, {"bos_token", "<s>"},          {"eos_token", "</s>"},
         {"unk_token", "<unk>"},                {"pad_token", nullptr},        {"add_bos_token", true},
         {"add_eos_token", false},              {"legacy", false},             {"sp_model_kwargs", nlohmann::ordered_json::object()},
         {"model_max_length", seq_len},         {"clean_up_tokenization_spaces", false}};
  } else {
    return;
  }
  write_json(out_dir / "tokenizer_config.json", t);
}

}  // namespace

std::vector<std::string> hf_export_caveats(const Manifest& m) {
  std::vector<std::string> caveats;
  const TransformerSpec spec = transformer_spec(m.model);
  if (spec.n_experts > 0 && m.model.moe_capacity_factor > 0) {
    char factor[32];
    std::snprintf(factor, sizeof factor, "%g", m.model.moe_capacity_factor);
    caveats.push_back("this checkpoint trained with model.moe_capacity_factor=" + std::string(factor) +
                      " (tokens over an expert's capacity dropped); Hugging Face's " + spec.family +
                      " is dropless, so there every token reaches its experts and the outputs differ from the "
                      "trained model's wherever tokens were dropped");
  }
  const DataConfig data = parse_command_line("ckpt", {}, m.config_ini).config.data;
  if (data.tokenizer == TokenizerKind::byte)
    caveats.push_back("this checkpoint trained on byte-level tokens (data.tokenizer=byte), which have no Hugging Face "
                      "tokenizer: the export has none, so feed it token ids (the text's UTF-8 bytes, 0-255) yourself");
  return caveats;
}

HfTransfer export_hf(const Manifest& m, const std::string& out_dir, const HfExportOptions& options) {
  require(options.dtype == "fp32" || options.dtype == "bf16", "--dtype must be fp32 or bf16, got '" + options.dtype + "'");
  require(options.max_shard_gb > 0, "--max_shard_gb must be > 0");
  Timer timer;
  const TransformerSpec spec = transformer_spec(m.model);
  // Hugging Face's Mixtral and Qwen3-MoE route with softmax: the same weights there would
  // be another model.
  require(spec.n_experts == 0 || m.model.moe_router_score == "softmax",
          "this checkpoint's router scores with sigmoid (model.moe_router_score): Hugging Face's " + spec.family +
              " routes with softmax, so it has no Hugging Face form");
  require(m.model.moe_router_bias_update_rate == 0,
          "this checkpoint's routers choose with an expert bias (model.moe_router_bias_update_rate): Hugging Face's " +
              spec.family + " has none, so it has no Hugging Face form");
  const ParameterLayout layout(m.model);
  std::vector<std::pair<std::string, std::vector<float>>> tensors = read_canonical(m, "params");
  const double source_seconds = timer.seconds();
  std::vector<SafetensorsEntry> entries;
  for (auto& [name, values] : tensors) {
    std::vector<int64_t> shape = layout.tensor(name).shape;
    if (hf_stores_transposed(spec, name)) {
      values = transposed(values, shape[0], shape[1]);
      std::swap(shape[0], shape[1]);
    }
    entries.push_back({name, shape, values.data()});
  }
  // Greedy shards in state-dict order, as huggingface_hub does; a tensor above the limit
  // gets a shard of its own.
  const double element = options.dtype == "fp32" ? 4 : 2;
  const double limit = options.max_shard_gb * 1e9;
  std::vector<std::vector<SafetensorsEntry>> shards(1);
  double in_shard = 0;
  for (const SafetensorsEntry& e : entries) {
    double bytes = element;
    for (int64_t d : e.shape) bytes *= static_cast<double>(d);
    if (!shards.back().empty() && in_shard + bytes > limit) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(e);
    in_shard += bytes;
  }
  fs::create_directories(out_dir);
  // Weights of an earlier export in the folder would be read instead of (or with) these.
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("model", 0) == 0 && name.find(".safetensors") != std::string::npos) fs::remove(e.path());
  }
  Timer writing;
  const std::string dtype = options.dtype == "fp32" ? "F32" : "BF16";
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  HfTransfer t;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  const int n = static_cast<int>(shards.size());
  for (int i = 0; i < n; i++) {
    char name[64];
    if (n == 1) std::snprintf(name, sizeof name, "model.safetensors");
    else std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i + 1, n);
    t.bytes += write_safetensors((fs::path(out_dir) / name).string(), shards[i], dtype, metadata);
    for (const SafetensorsEntry& e : shards[i]) weight_map[e.name] = name;
    t.files++;
  }
  if (n > 1)
    write_json(fs::path(out_dir) / "model.safetensors.index.json",
               {{"metadata", {{"total_size", t.bytes}}}, {"weight_map", weight_map}});
  // The tokenizer the run trained with travels with the weights, under the names HF's
  // tokenizers read: GPT2Tokenizer's vocab.json + merges.txt (the same files as
  // encoder.json + vocab.bpe), LlamaTokenizer's tokenizer.model; a .tiktoken rank file as
  // it is (HF has no reader of its own for it).
  // The checkpoint's own config, read as every config is.
  const DataConfig data = parse_command_line("ckpt", {}, m.config_ini).config.data;
  const std::string& tokenizer = data.tokenizer_path;
  const auto copy = [&](const fs::path& from, const std::string& to) {
    std::error_code ec;
    fs::copy_file(from, fs::path(out_dir) / to, fs::copy_options::overwrite_existing, ec);
    require(!ec, "copying the tokenizer file " + from.string() + " into " + out_dir + " failed: " + ec.message());
  };
  if (!tokenizer.empty() && fs::is_directory(tokenizer)) {
    if (fs::exists(fs::path(tokenizer) / "encoder.json")) copy(fs::path(tokenizer) / "encoder.json", "vocab.json");
    if (fs::exists(fs::path(tokenizer) / "vocab.bpe")) copy(fs::path(tokenizer) / "vocab.bpe", "merges.txt");
  } else if (!tokenizer.empty() && fs::exists(tokenizer)) {
    const bool sentencepiece = data.tokenizer == TokenizerKind::sentencepiece;
    copy(tokenizer, sentencepiece ? "tokenizer.model" : fs::path(tokenizer).filename().string());
  }
  nlohmann::ordered_json config = hf_config(spec, options.dtype == "fp32" ? "float32" : "bfloat16");
  write_hf_tokenizer_config(out_dir, data, spec.seq_len, config);
  write_json(fs::path(out_dir) / "config.json", config);
  t.seconds = writing.seconds();
  t.source_seconds = source_seconds;
  return t;
}

bool is_hf_checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return fs::exists(fs::path(path) / "config.json") || fs::exists(fs::path(path) / "model.safetensors") ||
           fs::exists(fs::path(path) / "model.safetensors.index.json");
  return fs::path(path).extension() == ".safetensors";
}

HfTransfer import_hf(const ShardedParameters& parameters, const std::string& path) {
  Timer timer;
  const size_t resident_before = resident_bytes();
  const ParameterLayout& layout = *parameters.layout;
  const TransformerSpec& spec = layout.spec();
  std::vector<std::string> files;
  fs::path dir = fs::path(path);
  if (fs::is_directory(path)) {
    const fs::path index = dir / "model.safetensors.index.json";
    if (fs::exists(index)) {
      const nlohmann::json j = read_json(index);
      require(j.contains("weight_map") && j["weight_map"].is_object(), index.string() + ": no weight_map");
      std::vector<std::string> names;
      for (const auto& [tensor, file] : j["weight_map"].items()) {
        require(file.is_string(), index.string() + ": weight_map['" + tensor + "'] is not a file name");
        const std::string f = file.get<std::string>();
        require(f.find('/') == std::string::npos, index.string() + ": weight_map names a file outside the folder: " + f);
        if (std::find(names.begin(), names.end(), f) == names.end()) names.push_back(f);
      }
      for (const std::string& f : names) files.push_back((dir / f).string());
    } else {
      require(fs::exists(dir / "model.safetensors"),
              path + ": neither model.safetensors nor model.safetensors.index.json (checkpoint.init_from)");
      files.push_back((dir / "model.safetensors").string());
    }
  } else {
    require(fs::exists(path), "checkpoint.init_from: no such file or folder '" + path + "'");
    files.push_back(path);
    dir = fs::path(path).parent_path();
  }
  // config.json, where there is one, must describe the configured model.
  const fs::path config_path = dir / "config.json";
  if (fs::exists(config_path)) {
    const nlohmann::json config = read_json(config_path);
    const std::vector<std::string> bad = hf_config_mismatches(config, spec);
    if (!bad.empty()) {
      std::string all;
      for (const std::string& b : bad) all += (all.empty() ? "" : "; ") + b;
      throw UsageError(config_path.string() + " does not describe the configured model: " + all);
    }
  }
  // Every tensor of every file, under our names; what is not a parameter is ignored.
  std::vector<std::unique_ptr<SafetensorsFile>> open;
  std::map<std::string, std::pair<const SafetensorsFile*, const SafetensorsTensor*>> found;
  const ParameterLayout whole(spec);  // every parameter of the model, for unexpected names
  for (const std::string& f : files) {
    open.push_back(std::make_unique<SafetensorsFile>(f));
    for (const SafetensorsTensor& t : open.back()->tensors()) {
      const std::string name = parameter_name_from_hf(spec, t.name);
      if (name.empty()) continue;
      require(whole.has(name), f + ": tensor '" + t.name + "' is not a parameter of the configured " + spec.describe());
      require(found.find(name) == found.end(), f + ": tensor '" + t.name + "' appears in two files");
      found[name] = {open.back().get(), &t};
    }
  }
  HfTransfer r;
  r.files = static_cast<int>(files.size());
  std::vector<float> buffer;
  for (const ParameterTensor& p : layout.tensors()) {
    const auto it = found.find(p.name);
    require(it != found.end(), path + ": missing tensor '" + p.name + "' of the configured " + spec.describe());
    const SafetensorsFile* file = it->second.first;
    const SafetensorsTensor* t = it->second.second;
    const bool transpose = hf_stores_transposed(spec, p.name);
    std::vector<int64_t> want = p.shape;
    if (transpose) std::swap(want[0], want[1]);
    if (t->shape != want) {
      std::string have, expected;
      for (int64_t d : t->shape) have += (have.empty() ? "" : ", ") + std::to_string(d);
      for (int64_t d : want) expected += (expected.empty() ? "" : ", ") + std::to_string(d);
      throw UsageError(file->path() + ": " + t->name + " has shape [" + have + "], the configured model needs [" +
                       expected + "]");
    }
    const int64_t columns = p.shape.size() > 1 ? p.shape[1] : 1, rows = p.shape[0];
    // Read in place where the parameters are host memory; else through one buffer reused
    // for every tensor (fresh pages are slow to touch, MACHINE.md).
    float* target = parameters.host_shard(p);
    if (target == nullptr) {
      if (buffer.size() < p.stored) buffer.resize(p.stored);
      target = buffer.data();
    }
    if (!transpose && !p.sharded()) file->prefetch(*t, 0, t->numel());  // the whole tensor is ours
    layout.shard_into(p, [&](int64_t first, int64_t n, float* out) {
      if (!transpose) {
        file->read(*t, first, n, out);
        return;
      }
      // Our element (r, c) is the file's (c, r): a piece of our row is a strided column there.
      const int64_t row = first / columns, column = first % columns;
      file->read(*t, column * rows + row, n, out, rows);
    }, target);
    file->release(*t);
    r.largest_slice_bytes = std::max<uint64_t>(r.largest_slice_bytes, p.stored * sizeof(float));
    r.bytes += p.stored * static_cast<uint64_t>(safetensors_dtype_bits(t->dtype) / 8);
    if (target == buffer.data()) parameters.set_shard(p, target);
  }
  parameters.changed();
  r.seconds = timer.seconds();
  r.peak_growth_bytes = peak_resident_bytes() > resident_before ? peak_resident_bytes() - resident_before : 0;
  return r;
}

}  // namespace trident
