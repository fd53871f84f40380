#include "config/config.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/did_you_mean.h"
#include "config/registry.h"
#include "kernels/base/error.h"
#include "storage/s3_endpoint.h"
#include "storage/s3_uri.h"

namespace po = boost::program_options;

namespace trident {

// Boost reads a choice by its name (found through the enum's namespace).
template <class E, class = decltype(Choices<E>::key)>
void validate(boost::any& value, const std::vector<std::string>& tokens, E*, int) {
  value = parse_choice<E>(po::validators::get_single_string(tokens));
}
namespace kernels {
using trident::validate;
}  // namespace kernels

namespace {

// A key bound to its field, its default shown as a user writes it: doubles in their
// shortest form that reads back exactly (1e-05, 0.1; Boost prints 1.0000000000000001e-05).
template <class T>
po::typed_value<T>* with_default(T* field) {
  return po::value(field)->default_value(*field);
}
template <>
po::typed_value<double>* with_default(double* field) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, *field).ptr;
  return po::value(field)->default_value(*field, std::string(text, end));
}

// Every config key, bound to its field. One table for the INI file, the flags and
// the printed config, so they cannot drift apart.
po::options_description config_options(Config& c) {
  po::options_description o("Configuration (INI [section] key = value, or --section.key=value)");
  auto& m = c.model;
  auto& p = c.parallel;
  auto& t = c.train;
  auto& d = c.data;
  auto& l = c.log;
  auto& ck = c.checkpoint;
  // The registered families and optimizers, as they are in this build.
  const std::string families = "model family: " + registered_choices("model.family");
  visit_model_fields(m, [&](const char* key, auto& field, const char* help) {
    o.add_options()(("model." + std::string(key)).c_str(), with_default(&field),
                    std::string(key) == "family" ? families.c_str() : help);
  });
  const std::string optimizers = "the optimizer: " + registered_choices("train.optimizer") + " (docs/models.md#optimizers)";
  o.add_options()
      ("parallel.dp", with_default(&p.dp), "data-parallel size (0: world / (tp*cp*pp))")
      ("parallel.tp", with_default(&p.tp), "tensor-parallel size")
      ("parallel.cp", with_default(&p.cp),
       "context-parallel size: each sequence cut into 2 cp chunks, rank i of the group holding chunks i and "
       "2cp-1-i; attention passes keys and values around the ring")
      ("parallel.ep", with_default(&p.ep),
       "expert-parallel size: a mixture of experts' experts split over blocks of ep data-parallel (dp x cp) "
       "ranks, tokens sent to their experts' ranks and back (all-to-all); must divide dp x cp and the experts")
      ("parallel.pp", with_default(&p.pp), "pipeline-parallel stages")
      ("parallel.pp_layers", with_default(&p.pp_layers), "layers per stage, e.g. 3,3,2 (empty: balanced)")
      ("parallel.schedule", with_default(&p.schedule),
       "pipeline schedule: 1f1b, gpipe, interleaved (with parallel.vpp) or zb1 (zero bubble, ZB-H1)")
      ("parallel.vpp", with_default(&p.vpp),
       "virtual pipeline stages per rank (parallel.schedule=interleaved): stage s holds chunks s, s+pp, ...")
      ("parallel.zero", with_default(&p.zero),
       "ZeRO stage: 1 shards the optimizer state over dp, 2 the gradients too, 3 the parameters too")
      ("parallel.sequence_parallel", with_default(&p.sequence_parallel),
       "split the norm and residual regions along the sequence over tp (needs tp > 1)")
      ("parallel.shard_size", with_default(&p.shard_size),
       "hybrid sharding: ZeRO's states sharded over groups of N dp ranks (a node), replicated across them "
       "(0: over all of dp)")
      ("parallel.bucket_mb", with_default(&p.bucket_mb), "gradient bucket size (MiB)")
      ("parallel.overlap", with_default(&p.overlap), "reduce gradient buckets during backward (ZeRO-2 always does)")
      ("parallel.ranks_per_node", with_default(&p.ranks_per_node), "ranks per node (0: from MPI)")
      ("parallel.timeout_s", with_default(&p.timeout_s), "bound on every blocking wait (s)")
      ("train.steps", with_default(&t.steps), "optimizer steps")
      ("train.global_batch", with_default(&t.global_batch), "sequences per step, all ranks")
      ("train.micro_batch", with_default(&t.micro_batch), "sequences per micro-batch (0: global_batch/dp)")
      ("train.lr", with_default(&t.lr), "peak learning rate")
      ("train.min_lr", with_default(&t.min_lr), "learning rate at the end of the decay (and after it)")
      ("train.warmup_steps", with_default(&t.warmup_steps), "linear warmup steps")
      ("train.lr_schedule", with_default(&t.lr_schedule),
       "after the warmup: cosine, linear, constant or wsd (warmup-stable-decay)")
      ("train.lr_decay_steps", with_default(&t.lr_decay_steps),
       "the step at which the decay reaches min_lr, kept after it (0: train.steps; Megatron's --lr-decay-iters)")
      ("train.wsd_decay", with_default(&t.wsd_decay),
       "wsd: its final linear decay, in steps (>= 1) or as a fraction of the steps after the warmup (< 1)")
      ("train.optimizer", with_default(&t.optimizer), optimizers.c_str())
      ("train.weight_decay", with_default(&t.weight_decay), "decoupled weight decay (matrices and embeddings)")
      ("train.grad_clip", with_default(&t.grad_clip), "global gradient-norm clip (0: off)")
      ("train.beta1", with_default(&t.beta1), "AdamW's beta1; Lion's interpolation of momentum and gradient")
      ("train.beta2", with_default(&t.beta2), "AdamW's beta2; Lion's momentum decay (Lion's paper: 0.99)")
      ("train.adam_eps", with_default(&t.adam_eps), "AdamW epsilon")
      ("train.seed", with_default(&t.seed), "seed of initialization and data order")
      ("train.device", with_default(&t.device), "cpu or cuda")
      ("train.precision", with_default(&t.precision),
       "fp32, bf16 (bf16 compute, fp32 master weights; emulated on cpu) or auto (bf16 on cuda)")
      ("train.max_bad_steps", with_default(&t.max_bad_steps),
       "steps in a row with a non-finite loss or gradient norm (each skipped) before going back to the last "
       "checkpoint once; a second streak ends the run with exit 4")
      ("train.spike_factor", with_default(&t.spike_factor), "report a loss above this times its running mean (0: never)")
      ("train.replica_check_steps", with_default(&t.replica_check_steps),
       "every N steps the data-parallel replicas' parameters are hashed and compared; a replica that differs "
       "is named and the run goes back to the last checkpoint once, a second time on one host ends the run "
       "naming it (exit 3) (0: never)")
      ("train.recompute", with_default(&t.recompute),
       "activations recomputed in backward: none, selective (attention's core) or full (each layer)")
      ("train.recompute_layers", with_default(&t.recompute_layers),
       "with train.recompute=full: the layers of each pipeline stage (model chunk) recomputed whole, the others "
       "keeping their activations (Megatron's --recompute-num-layers; 0: every layer)")
      ("train.recompute_method", with_default(&t.recompute_method),
       "which train.recompute_layers: block (each chunk's first N) or uniform (N spread evenly over the chunk)")
      ("data.path", with_default(&d.path),
       "Megatron dataset prefix, llm.c shard glob, text file or folder, or a blend \"0.7 web 0.3 code\"; any "
       "of them as s3://bucket/key (each node copies it to data.cache_dir; training starts meanwhile, reading a "
       "Megatron token file with ranged GETs until its copy is complete: data.wait_for_copy, data.stream; S3 "
       "settings: checkpoint.s3_*)")
      ("data.tokenizer", with_default(&d.tokenizer),
       "byte, gpt2, llama3 or sentencepiece (text data is tokenized with it at start; 'trident prepare' "
       "tokenizes once, for every later run)")
      ("data.tokenizer_path", with_default(&d.tokenizer_path),
       "gpt2: folder with encoder.json + vocab.bpe, or a .tiktoken file; llama3: tokenizer.model; "
       "sentencepiece: a .model file")
      ("data.json_key", with_default(&d.json_key), "JSONL input: the key of each line's document")
      ("data.val_fraction", with_default(&d.val_fraction), "fraction of documents held out")
      ("data.val_path", with_default(&d.val_path),
       "a validation dataset of its own, any data.path form (empty: val_fraction of data.path)")
      ("data.cache_dir", with_default(&d.cache_dir),
       "where each node copies data.path and val_path entries given as s3://bucket/prefix "
       "(empty: $SLURM_TMPDIR/trident-data, else /tmp/trident-data); files already there that verify are kept")
      ("data.s3_endpoint", with_default(&d.s3_endpoint),
       "the S3-compatible store of s3:// data, http(s)://host:port (empty: checkpoint.s3_endpoint, else "
       "AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS S3)")
      ("data.stream", with_default(&d.stream),
       "read s3:// Megatron prefixes with ranged GETs as training needs them (each batch's sequences "
       "fetched together), instead of copying them to data.cache_dir first; other s3:// entries are still copied")
      ("data.stream_cache_mb", with_default(&d.stream_cache_mb),
       "data.stream: the fetched ranges each rank keeps (least recently used out first; the validation "
       "batches come from it)")
      ("data.wait_for_copy", with_default(&d.wait_for_copy),
       "s3:// data copied to data.cache_dir: start training only when every copy is complete (default false: "
       "a Megatron token file is read with ranged GETs while the node leader copies it, then from the copy)")
      ("data.document_mask", with_default(&d.document_mask),
       "attention within each document only: a token sees the earlier tokens of its own document (documents "
       "end with data.eod_token); positions stay those of the sequence")
      ("data.eod_token", with_default(&d.eod_token),
       "the end-of-document token id of data.document_mask (-1: the tokenizer's end-of-sequence token)")
      ("checkpoint.dir", with_default(&ck.dir), "checkpoint directory (empty: none)")
      ("checkpoint.every_steps", with_default(&ck.every_steps), "save every N steps (0: only the last step and on signals)")
      ("checkpoint.keep_last", with_default(&ck.keep_last), "complete checkpoints kept (0: all)")
      ("checkpoint.async", with_default(&ck.async), "write in the background")
      ("checkpoint.memory_every_steps", with_default(&ck.memory_every_steps),
       "each rank's state into node memory every N steps, with a copy on the partner node, for a restart inside the "
       "allocation (0: off)")
      ("checkpoint.memory_dir", with_default(&ck.memory_dir),
       "the memory tier's folder: a RAM file system on every node (tmpfs)")
      ("checkpoint.load", with_default(&ck.load), "step directory to resume from (default: dir/latest)")
      ("checkpoint.init_from", with_default(&ck.init_from), "parameters to start from (step 0, a fresh optimizer): an exported .h5, Hugging Face weights (a folder with config.json and safetensors, or a .safetensors file), or a trident checkpoint (a step folder, or a checkpoint.dir: its newest complete step)")
      ("checkpoint.lease_s", with_default(&ck.lease_s),
       "a run's lease on checkpoint.dir (one folder, one run) not renewed for this long is stale and may be taken "
       "over (0: auto, the larger of parallel.timeout_s and 4 step times)")
      ("checkpoint.upload", with_default(&ck.upload),
       "s3://bucket/prefix: every complete checkpoint is uploaded there in the background (node files, then "
       "manifest.json, then latest), and a run with no checkpoint on disk resumes from there")
      ("checkpoint.s3_endpoint", with_default(&ck.s3_endpoint), "an S3-compatible store's URL (empty: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS S3)")
      ("checkpoint.s3_region", with_default(&ck.s3_region),
       "the bucket's region (empty: AWS_REGION, AWS_DEFAULT_REGION, ~/.aws/config, the EC2 instance's; else us-east-1)")
      ("checkpoint.s3_part_mb", with_default(&ck.s3_part_mb), "multipart part size in MiB (at least 5)")
      ("checkpoint.s3_parallel", with_default(&ck.s3_parallel), "parts in flight per node file")
      ("checkpoint.s3_retry_s", with_default(&ck.s3_retry_s),
       "how long one S3 request is retried (503 Slow Down, no answer) before the upload counts as failed")
      ("checkpoint.upload_timeout_s", with_default(&ck.upload_timeout_s),
       "the end of a run (and a stop on SIGUSR1/SIGTERM) waits this long for the last upload, then exits 3")
      ("log.run_dir", with_default(&l.run_dir), "directory of metrics.jsonl")
      ("log.every_steps", with_default(&l.every_steps), "log every N steps")
      ("log.straggler_factor", with_default(&l.straggler_factor),
       "at each log step, name the slowest rank when its work took this many times its stage's median (0: never)")
      ("log.straggler_limit", with_default(&l.straggler_limit),
       "the same rank named a straggler this many log steps in a row ends the run with exit 3, its host named "
       "for the batch script to drain (0: report only)")
      ("log.gpu_error_limit", with_default(&l.gpu_error_limit),
       "log steps at which a machine's GPU XID or uncorrected ECC count rose before the run ends with exit 3, "
       "its host named for the batch script to drain (0: warn only)")
      ("log.val_every_steps", with_default(&l.val_every_steps), "validation every N steps (0: at the end)")
      ("log.val_batches", with_default(&l.val_batches), "validation batches per evaluation")
      ("log.sample_every_steps", with_default(&l.sample_every_steps),
       "print a greedy sample of the model every N steps (0: never)")
      ("log.peak_gflops", with_default(&l.peak_gflops), "peak GFLOP/s for MFU (0: measure)")
      ("log.tensorboard_dir", with_default(&l.tensorboard_dir),
       "TensorBoard event files (empty: <log.run_dir>/tensorboard; none: off)")
      ("log.expert_tokens_per_layer", with_default(&l.expert_tokens_per_layer),
       "a mixture of experts: log each layer's tokens per expert too (metrics.jsonl expert_tokens_per_layer, "
       "TensorBoard moe/expert-tokens/layer-L/expert-E), beside their sum over the layers")
      ("log.metrics_port", with_default(&l.metrics_port),
       "serve Prometheus metrics at http://HOST:PORT/metrics (rank 0, and the first rank of each other machine; 0: off)")
      ("log.trace_steps", with_default(&l.trace_steps),
       "A:B writes a Chrome trace (Perfetto) of steps A to B, every rank, into log.run_dir (empty: none)");
  return o;
}

// Flags are exact keys, as in the INI file: no unique-prefix guessing (--train.warmup
// must not quietly set train.warmup_steps).
constexpr int kFlagStyle = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;

// " (did you mean --train.warmup_steps?)" for a key that is a prefix of known keys or
// a few edits away from one, or another trainer's name for one (--parallel.expert_parallel:
// --parallel.ep); "" when none is close.
std::string did_you_mean(std::string unknown, const po::options_description& options, bool as_flag) {
  const size_t equals = unknown.find('=');
  if (equals != std::string::npos) unknown.resize(equals);
  while (!unknown.empty() && unknown[0] == '-') unknown.erase(0, 1);
  std::vector<std::string> close;
  if (const std::string alias = key_alias(unknown); !alias.empty()) {
    close.push_back(alias);
  } else {
    std::vector<std::string> keys;
    for (const auto& option : options.options())
      if (!option->long_name().empty()) keys.push_back(option->long_name());
    close = closest_names(unknown, keys);
  }
  if (close.empty()) return "";
  std::string text = " (did you mean ";
  for (size_t i = 0; i < close.size(); i++)
    text += (i == 0 ? "" : i + 1 == close.size() ? " or " : ", ") + std::string(as_flag ? "--" : "") + close[i];
  return text + "?)";
}

// "--checkpoint.dir=" (an empty value: clear what the INI file set) as Boost reads it:
// the key, then an empty argument.
std::vector<std::string> with_empty_values_split(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const std::string& a : args) {
    if (a.size() > 3 && a.rfind("--", 0) == 0 && a.back() == '=' && a.find('=') == a.size() - 1) {
      out.push_back(a.substr(0, a.size() - 1));
      out.emplace_back();
    } else {
      out.push_back(a);
    }
  }
  return out;
}

// The line of `file` that Boost quotes in its syntax error, as "FILE:LINE".
std::string where_in_file(const std::string& file, const std::string& quoted) {
  std::ifstream in(file);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    number++;
    const size_t first = line.find_first_not_of(" \t"), last = line.find_last_not_of(" \t\r");
    if (first != std::string::npos && line.substr(first, last - first + 1) == quoted) return file + ":" + std::to_string(number);
  }
  return file;
}

// Where `key` ("train.step") is set in an INI file, as "FILE:LINE".
std::string where_key_is(const std::string& file, const std::string& key) {
  const std::string section = key.substr(0, key.find('.')), name = key.substr(key.find('.') + 1);
  std::ifstream in(file);
  std::string current;
  int number = 0;
  const auto trim = [](std::string t) {
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t\r") + 1);
    return t;
  };
  for (std::string line; std::getline(in, line);) {
    number++;
    const std::string t = trim(line);
    if (t.size() > 2 && t.front() == '[' && t.back() == ']') current = trim(t.substr(1, t.size() - 2));
    else if (current == section && trim(t.substr(0, t.find('='))) == name) return file + ":" + std::to_string(number);
  }
  return file;
}

std::string format_value(const boost::any& v) {
  std::ostringstream s;
  if (auto* i = boost::any_cast<int>(&v)) s << *i;
  else if (auto* d = boost::any_cast<double>(&v)) s << *d;
  else if (auto* u = boost::any_cast<uint64_t>(&v)) s << *u;
  else if (auto* str = boost::any_cast<std::string>(&v)) s << *str;
  else if (auto* b = boost::any_cast<bool>(&v)) s << (*b ? "true" : "false");
  else if (auto* e = boost::any_cast<Schedule>(&v)) s << *e;
  else if (auto* e = boost::any_cast<Recompute>(&v)) s << *e;
  else if (auto* e = boost::any_cast<RecomputeMethod>(&v)) s << *e;
  else if (auto* e = boost::any_cast<PrecisionSetting>(&v)) s << *e;
  else if (auto* e = boost::any_cast<LrShape>(&v)) s << *e;
  else if (auto* e = boost::any_cast<TokenizerKind>(&v)) s << *e;
  else if (auto* e = boost::any_cast<Device>(&v)) s << *e;
  else s << "?";
  return s.str();
}

}  // namespace

void Config::validate() const {
  const auto positive = [](auto value, const char* key) {
    require(value > 0, std::string(key) + " must be positive, got " + std::to_string(value));
  };
  check_registered_choice("model.family", model.family);
  positive(model.n_layer, "model.n_layer");
  positive(model.n_head, "model.n_head");
  positive(model.d_model, "model.d_model");
  positive(model.seq_len, "model.seq_len");
  positive(model.vocab_size, "model.vocab_size");
  positive(model.norm_eps, "model.norm_eps");
  require(model.n_kv_head >= 0, "model.n_kv_head must be >= 0 (0: n_head)");
  require(model.ffn_dim >= 0, "model.ffn_dim must be >= 0 (0: the family's default)");
  require(model.sliding_window >= 0, "model.sliding_window must be >= 0 (0: attention over all earlier tokens)");
  require(model.head_dim >= 0, "model.head_dim must be >= 0 (0: d_model / n_head)");
  require(model.head_dim > 0 || model.d_model % model.n_head == 0,
          "model.d_model (" + std::to_string(model.d_model) + ") must be a multiple of model.n_head (" +
              std::to_string(model.n_head) + "), or model.head_dim given");
  require(parallel.dp >= 0, "parallel.dp must be >= 0 (0: derived from the world size)");
  positive(parallel.tp, "parallel.tp");
  positive(parallel.cp, "parallel.cp");
  positive(parallel.pp, "parallel.pp");
  positive(parallel.ep, "parallel.ep");
  require(parallel.ep == 1 || parallel.shard_size == 0,
          "parallel.ep > 1 with parallel.shard_size (hybrid sharding) is not supported: set parallel.shard_size=0");
  positive(parallel.vpp, "parallel.vpp");
  require(parallel.schedule != Schedule::interleaved || parallel.pp > 1,
          "parallel.schedule=interleaved needs parallel.pp > 1 (it interleaves the stages' model chunks)");
  require(parallel.vpp == 1 || parallel.schedule == Schedule::interleaved,
          "parallel.vpp=" + std::to_string(parallel.vpp) + " needs parallel.schedule=interleaved (it is " +
              name_of(parallel.schedule) + "); or parallel.vpp=1");
  positive(parallel.timeout_s, "parallel.timeout_s");
  require(parallel.zero >= 0 && parallel.zero <= 3,
          "parallel.zero must be 0, 1 (optimizer state sharded), 2 (and gradients) or 3 (and parameters), got " +
              std::to_string(parallel.zero));
  positive(parallel.bucket_mb, "parallel.bucket_mb");
  require(parallel.shard_size == 0 || parallel.shard_size >= 2,
          "parallel.shard_size must be 0 (shard over all of dp) or at least 2, got " + std::to_string(parallel.shard_size));
  require(parallel.shard_size == 0 || parallel.zero >= 1,
          "parallel.shard_size needs parallel.zero = 1, 2 or 3 (there is nothing to shard without ZeRO)");
  require(!parallel.sequence_parallel || parallel.tp > 1,
          "parallel.sequence_parallel needs parallel.tp > 1 (it splits tensor parallelism's replicated regions)");

  require(parallel.ranks_per_node >= 0, "parallel.ranks_per_node must be >= 0 (0: from MPI)");
  require(train.steps >= 0, "train.steps must be >= 0");
  positive(train.global_batch, "train.global_batch");
  require(train.micro_batch >= 0, "train.micro_batch must be >= 0 (0: global_batch / dp)");
  positive(train.max_bad_steps, "train.max_bad_steps");
  require(train.recompute_layers >= 0, "train.recompute_layers must be >= 0 (0: every layer), got " +
                                          std::to_string(train.recompute_layers));
  require(train.recompute_layers == 0 || train.recompute == Recompute::full,
          "train.recompute_layers=" + std::to_string(train.recompute_layers) + " needs train.recompute=full (it is " +
              name_of(train.recompute) + "): it picks the layers that full recomputation reruns");
  require(train.replica_check_steps >= 0, "train.replica_check_steps must be >= 0 (0: never)");
  require(log.straggler_limit >= 0, "log.straggler_limit must be >= 0 (0: report only)");
  require(log.gpu_error_limit >= 0, "log.gpu_error_limit must be >= 0 (0: warn only)");
  require(train.spike_factor >= 0, "train.spike_factor must be >= 0 (0: no spike reports)");
  require(train.lr >= 0, "train.lr must be >= 0, got " + std::to_string(train.lr));
  require(train.min_lr >= 0 && train.min_lr <= train.lr,
          "train.min_lr must lie in [0, train.lr], got " + std::to_string(train.min_lr));
  require(train.warmup_steps >= 0, "train.warmup_steps must be >= 0");
  require(train.lr_decay_steps >= 0, "train.lr_decay_steps must be >= 0 (0: train.steps)");
  require(train.lr_decay_steps == 0 || train.lr_decay_steps > train.warmup_steps,
          "train.lr_decay_steps (" + std::to_string(train.lr_decay_steps) + ") must be past train.warmup_steps (" +
              std::to_string(train.warmup_steps) + ")");
  require(train.wsd_decay > 0, "train.wsd_decay must be positive: steps (>= 1) or a fraction (< 1)");
  require(train.weight_decay >= 0, "train.weight_decay must be >= 0");
  require(train.grad_clip >= 0, "train.grad_clip must be >= 0 (0: no clipping)");
  check_registered_choice("train.optimizer", train.optimizer);
  require(train.beta1 >= 0 && train.beta1 < 1, "train.beta1 must lie in [0, 1)");
  require(train.beta2 >= 0 && train.beta2 < 1, "train.beta2 must lie in [0, 1)");
  positive(train.adam_eps, "train.adam_eps");
  require(data.tokenizer == TokenizerKind::byte || !data.tokenizer_path.empty(),
          "data.tokenizer=" + std::string(name_of(data.tokenizer)) +
              " needs data.tokenizer_path (its tokenizer file or folder)");
  require(data.val_fraction >= 0 && data.val_fraction < 1, "data.val_fraction must lie in [0, 1)");
  require(data.eod_token >= -1 && data.eod_token < model.vocab_size,
          "data.eod_token (" + std::to_string(data.eod_token) + ") must be a token id below model.vocab_size (" +
              std::to_string(model.vocab_size) + "), or -1 (the tokenizer's)");
  if (!data.s3_endpoint.empty()) resolve_s3_endpoint(data.s3_endpoint, "data.s3_endpoint");  // an http(s):// URL
  require(checkpoint.every_steps >= 0, "checkpoint.every_steps must be >= 0");
  require(checkpoint.memory_every_steps >= 0, "checkpoint.memory_every_steps must be >= 0");
  require(checkpoint.memory_every_steps == 0 || !checkpoint.memory_dir.empty(),
          "checkpoint.memory_dir must name a folder (default /dev/shm)");
  require(checkpoint.memory_every_steps == 0 || !checkpoint.dir.empty(),
          "checkpoint.memory_every_steps needs checkpoint.dir (a restart resumes from the newer of the two tiers)");
  require(checkpoint.keep_last >= 0, "checkpoint.keep_last must be >= 0 (0: keep all)");
  require(checkpoint.every_steps == 0 || !checkpoint.dir.empty(), "checkpoint.every_steps needs checkpoint.dir");
  require(checkpoint.lease_s >= 0, "checkpoint.lease_s must be >= 0 (0: auto, from parallel.timeout_s and the step "
                                   "time), got " + std::to_string(checkpoint.lease_s));
  if (!checkpoint.upload.empty()) {
    parse_s3_uri(checkpoint.upload);
    require(!checkpoint.dir.empty(), "checkpoint.upload needs checkpoint.dir (the first tier, where each checkpoint "
                                     "is complete before it goes to S3)");
    const S3Endpoint endpoint = resolve_s3_endpoint(checkpoint.s3_endpoint, "checkpoint.s3_endpoint");
    if (!checkpoint.s3_region.empty()) check_s3_region(checkpoint.s3_region, !endpoint.url.empty());
    require(checkpoint.s3_part_mb >= 5, "checkpoint.s3_part_mb must be at least 5: S3 refuses parts below 5 MiB, got " +
                                            std::to_string(checkpoint.s3_part_mb));
    require(checkpoint.s3_part_mb <= 5120, "checkpoint.s3_part_mb must be at most 5120: S3's largest part is 5 GiB");
    require(checkpoint.s3_parallel >= 1 && checkpoint.s3_parallel <= 256, "checkpoint.s3_parallel must lie in 1-256");
    positive(checkpoint.s3_retry_s, "checkpoint.s3_retry_s");
    positive(checkpoint.upload_timeout_s, "checkpoint.upload_timeout_s");
  }
  positive(log.every_steps, "log.every_steps");
  require(log.straggler_factor == 0 || log.straggler_factor >= 1,
          "log.straggler_factor must be 0 (off) or at least 1, got " + std::to_string(log.straggler_factor));
  require(log.val_every_steps >= 0, "log.val_every_steps must be >= 0");
  require(log.val_batches >= 0, "log.val_batches must be >= 0");
  require(log.sample_every_steps >= 0, "log.sample_every_steps must be >= 0");
  require(log.peak_gflops >= 0, "log.peak_gflops must be >= 0");
  require(log.metrics_port >= 0 && log.metrics_port <= 65535,
          "log.metrics_port must be a TCP port, 1-65535 (0: off), got " + std::to_string(log.metrics_port));
  const int trace_last = log.trace_range().second;
  require(trace_last <= train.steps, "log.trace_steps ends at step " + std::to_string(trace_last) +
                                         ", past train.steps (" + std::to_string(train.steps) + ")");
}

std::string TrainConfig::recompute_description() const {
  if (recompute != Recompute::full || recompute_layers == 0) return name_of(recompute);
  return "full (" + std::to_string(recompute_layers) + " layer(s) per chunk, " + name_of(recompute_method) + ")";
}

std::string LogConfig::tensorboard_folder() const {
  if (tensorboard_dir == "none") return "";
  if (!tensorboard_dir.empty()) return tensorboard_dir;
  return run_dir.empty() ? "" : (std::filesystem::path(run_dir) / "tensorboard").string();
}

std::pair<int, int> LogConfig::trace_range() const {
  if (trace_steps.empty()) return {0, 0};
  const size_t colon = trace_steps.find(':');
  int first = 0, last = 0;
  try {
    first = std::stoi(trace_steps.substr(0, colon));
    last = colon == std::string::npos ? first : std::stoi(trace_steps.substr(colon + 1));
  } catch (const std::exception&) {
    first = last = 0;
  }
  require(first >= 1 && last >= first,
          "log.trace_steps must be A:B with 1 <= A <= B (the steps to trace, as printed), got '" + trace_steps + "'");
  return {first, last};
}

void Config::resolve_layout(int world_size) {
  ParallelDims d = ParallelDims::resolve(world_size, parallel.axis_sizes());
  d.set_ep(parallel.ep);
  parallel.dp = d.size(Axis::dp);
  if (train.global_batch % parallel.dp != 0) {
    // What would do: the dp sizes that divide the batch, as rank counts of this tp x pp
    // (a job requeued on fewer or more nodes keeps its global batch).
    const int per_replica = d.size(Axis::tp) * d.size(Axis::cp) * d.size(Axis::pp);
    std::string would;
    for (int dp = 1; dp <= train.global_batch && would.size() < 80; dp++)
      if (train.global_batch % dp == 0) would += (would.empty() ? "" : ", ") + std::to_string(dp * per_replica);
    throw UsageError("train.global_batch (" + std::to_string(train.global_batch) + ") must be a multiple of dp (" +
                     std::to_string(parallel.dp) + ", from " + std::to_string(world_size) + " ranks / tp " +
                     std::to_string(d.size(Axis::tp)) + (d.size(Axis::cp) > 1 ? " / cp " + std::to_string(d.size(Axis::cp)) : "") + " / pp " + std::to_string(d.size(Axis::pp)) + "): ranks that would keep this batch: " +
                     would + " (or another --train.global_batch)");
  }
  const int per_rank = train.global_batch / parallel.dp;
  if (train.micro_batch == 0) train.micro_batch = per_rank;
  require(per_rank % train.micro_batch == 0,
          "train.micro_batch (" + std::to_string(train.micro_batch) + ") must divide the per-rank batch " +
              std::to_string(per_rank) + " (global_batch / dp)");
  if (parallel.schedule == Schedule::interleaved) {
    // Megatron's rule: the micro-batches go round the stages in groups of pp.
    const int micro_batches = per_rank / train.micro_batch;
    if (micro_batches % parallel.pp != 0) {
      std::string would;
      for (int mb = 1; mb <= per_rank; mb++)
        if (per_rank % mb == 0 && (per_rank / mb) % parallel.pp == 0) would += (would.empty() ? "" : ", ") + std::to_string(mb);
      throw UsageError("parallel.schedule=interleaved needs a multiple of parallel.pp (" + std::to_string(parallel.pp) +
                       ") micro-batches per step, got " + std::to_string(micro_batches) + " (global_batch " +
                       std::to_string(train.global_batch) + " / dp " + std::to_string(parallel.dp) + " / micro_batch " +
                       std::to_string(train.micro_batch) + "): " +
                       (would.empty() ? "no train.micro_batch would do; raise train.global_batch to a multiple of " +
                                            std::to_string(parallel.pp * parallel.dp)
                                      : "train.micro_batch " + would + " would do"));
    }
  }
}

ParallelDims Config::dims() const {
  check(parallel.dp > 0, "Config::dims() before resolve_layout (dp is still 0)");
  int world = 1;
  for (const AxisSize& a : parallel.axis_sizes()) world *= a.size;
  ParallelDims d = ParallelDims::resolve(world, parallel.axis_sizes());
  d.set_ep(parallel.ep);
  d.set_sequence_parallel(parallel.sequence_parallel && parallel.tp > 1);
  d.set_shard_size(parallel.shard_size);
  return d;
}

std::string Config::to_ini() const {
  Config copy = *this;
  po::options_description options = config_options(copy);
  std::ostringstream out;
  std::string section;
  for (const auto& option : options.options()) {
    const std::string& key = option->long_name();
    const std::string sec = key.substr(0, key.find('.'));
    if (sec != section) out << (section.empty() ? "" : "\n") << "[" << (section = sec) << "]\n";
    boost::any value;
    option->semantic()->apply_default(value);
    out << key.substr(key.find('.') + 1) << " = " << format_value(value) << "\n";
  }
  return out.str();
}

std::vector<std::string> take_command_options(const std::vector<std::string>& args, const po::options_description& own,
                                              const std::string& usage) {
  try {
    po::variables_map vm;
    const po::parsed_options parsed =
        po::command_line_parser(with_empty_values_split(args)).options(own).style(kFlagStyle).allow_unregistered().run();
    po::store(parsed, vm);
    po::notify(vm);
    return po::collect_unrecognized(parsed.options, po::include_positional);
  } catch (const po::error& e) {
    throw UsageError(std::string(e.what()) + (usage.empty() ? "" : "\n" + usage));
  }
}

CommandLine parse_command_line(const std::string& command, const std::vector<std::string>& args,
                               const std::string& defaults_ini) {
  CommandLine cl;
  cl.command = command;
  std::string config_file, device;
  po::options_description general("Options of 'trident " + command + "'");
  general.add_options()("help,h", "show this help")(
      "config", po::value(&config_file), "INI file of settings (flags given too win)")(
      "device", po::value(&device), "cpu or cuda: shorthand for --train.device");
  if (command == "verify")
    general.add_options()("reference", po::value(&cl.reference)->required(),
                          "reference HDF5 file (shared/reference/FORMAT.md)");
  po::options_description all;
  all.add(general).add(config_options(cl.config));
  std::ostringstream help;
  help << "usage: trident " << command << " [--config FILE.ini] [--section.key=value ...]\n\n" << all;
  cl.help_text = help.str();

  po::variables_map vm;
  std::string reading = "flag";  // what is being read, for the error's hint
  try {
    po::store(po::command_line_parser(with_empty_values_split(args)).options(all).style(kFlagStyle).run(), vm);
    if (vm.count("help")) {
      cl.help = true;
      return cl;
    }
    if (vm.count("config")) {
      const std::string file = vm["config"].as<std::string>();
      std::ifstream in(file);
      require(in.good(), "cannot read config file '" + file + "'");
      reading = file;
      // Stored after the flags: po::store keeps the first value, so flags win.
      po::store(po::parse_config_file(in, all, /*allow_unregistered=*/false), vm);
    }
    for (const auto& [key, value] : vm)
      if (!value.defaulted() && key.find('.') != std::string::npos) cl.given.insert(key);
    if (!defaults_ini.empty()) {  // below the file and the flags
      reading = "the stored config";
      std::istringstream in(defaults_ini);
      po::store(po::parse_config_file(in, all, /*allow_unregistered=*/false), vm);
    }
    po::notify(vm);
  } catch (const po::invalid_config_file_syntax& e) {
    throw UsageError(where_in_file(reading, e.tokens()) + ": " + e.what() + " (an INI file holds [section] lines and "
                     "key = value lines)");
  } catch (const po::unknown_option& e) {
    const bool flag = reading == "flag";
    throw UsageError((flag ? "" : where_key_is(reading, e.get_option_name()) + ": ") + std::string(e.what()) +
                     did_you_mean(e.get_option_name(), all, flag) + " (see 'trident " + command + " --help')");
  } catch (const po::error& e) {
    throw UsageError((reading == "flag" ? "" : reading + ": ") + std::string(e.what()) + " (see 'trident " + command +
                     " --help')");
  }
  if (!device.empty()) cl.config.train.device = parse_choice<Device>(device);
  cl.config.validate();
  return cl;
}

}  // namespace trident
