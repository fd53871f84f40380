// The resolved configuration of a run: INI file sections [model] [parallel] [train]
// [data] [log], every key also a flag `--section.key=value` (flags win). Parsing and
// validation live in config.cpp; a bad value is a UsageError (exit code 2).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include <vector>

#include <boost/program_options/options_description.hpp>

#include "config/choices.h"
#include "parallel/parallel_dims.h"

namespace trident {

// Llama 3.1's rotary frequency scaling (Hugging Face's rope_scaling, rope_type "llama3").
struct RopeScaling {
  std::string type = "none";        // none | llama3
  double factor = 8;                // how much slower the low frequencies turn
  double low_freq_factor = 1;       // wavelengths above original_max_position / this: scaled
  double high_freq_factor = 4;      // below original_max_position / this: kept
  int original_max_position = 8192;
};

// The model's shape; what its family makes of it (norm, positions, MLP, names):
// model/families/.
struct ModelConfig {
  std::string family = "gpt2";   // a registered family (model/families/): gpt2, llama, qwen2, qwen3, mistral, mixtral, qwen3_moe, olmo2
  int n_layer = 4;               // transformer blocks
  int n_head = 4;                // attention (query) heads
  int n_kv_head = 0;             // key/value heads (grouped-query attention); 0: n_head
  int head_dim = 0;              // each head's width; 0: d_model / n_head (Qwen3, Mistral Nemo: 128 apart from it)
  int d_model = 128;             // width of the residual stream
  int ffn_dim = 0;               // MLP hidden width; 0: 4 d (gpt2), 2/3 of 4 d rounded up to 256 (llama)
  int seq_len = 128;             // context length T
  int vocab_size = 256;          // real vocabulary V (256 = byte-level tokens)
  bool tie_word_embeddings = false;  // llama-style: the head reads the token embedding (small Qwen3s); gpt2 always ties
  double norm_eps = 1e-5;        // LayerNorm (gpt2) or RMSNorm (llama) epsilon
  double rope_theta = 10000;     // rotary base (llama)
  RopeScaling rope_scaling;      // llama
  int sliding_window = 0;        // mistral: each token attends to this many latest tokens (itself included); 0: all
  // Mixture of experts (mixtral, qwen3_moe: model/layers/moe.h)
  int n_experts = 0;               // experts per MoE block (0: dense; the family's default)
  int n_experts_per_token = 0;     // top-k: the experts each token is sent to (0: the family's default)
  int moe_ffn_dim = 0;             // each expert's hidden width (0: ffn_dim)
  bool moe_norm_topk = true;       // the top-k weights divided by their sum (Mixtral; Qwen3-MoE's norm_topk_prob)
  std::string moe_router_score = "softmax";  // softmax or sigmoid (DeepSeek-V3's, Megatron's moe_router_score_function)
  // Loss-free balancing (DeepSeek-V3's bias_update_speed, Megatron's moe_router_bias_update_rate):
  // each expert's bias moves by this much a step towards the mean load (0: off).
  double moe_router_bias_update_rate = 0;
  static constexpr double kMoeDroplessHeadroom = 2.0;  // a random router sends a rank up to 1.7x (docs/memory.md)
  double moe_capacity_factor = 0;  // each expert takes at most ceil(factor T K / E) of a sequence's tokens (0: dropless)
  std::string moe_token_drop_policy = "probs";  // over capacity, drop the lowest weights (probs) or the latest (position)
  // Dropless under expert parallelism: the rows a rank's experts hold (and the memory plan
  // counts), as a multiple of the balanced share; more are held beyond the plan, with a warning.
  double moe_dropless_headroom = kMoeDroplessHeadroom;
  double router_aux_loss_coef = 0.001;  // the load-balancing loss's coefficient
  double router_z_loss_coef = 0;        // the router z-loss's coefficient
};

// Every field of ModelConfig, once, in the order of the config's keys: its key (model.KEY
// in the config; the same key in the manifests and exports) and its help. The config's
// options, the checkpoint's model record and (through each family's names for the keys)
// Hugging Face's config.json all go through it, so a field added here reaches them all.
// visit(key, field, help); Model: ModelConfig or const ModelConfig.
template <class Model, class Visit>
void visit_model_fields(Model& m, Visit&& visit) {
  visit("family", m.family, "model family (model/families/)");
  visit("n_layer", m.n_layer, "transformer blocks");
  visit("n_head", m.n_head, "attention (query) heads");
  visit("n_kv_head", m.n_kv_head, "key/value heads, grouped-query attention (0: n_head; llama)");
  visit("head_dim", m.head_dim, "each attention head's width (0: d_model / n_head; llama-style families)");
  visit("d_model", m.d_model, "model width");
  visit("ffn_dim", m.ffn_dim, "MLP hidden width (0: 4 d_model for gpt2, 2/3 of it rounded up to 256 for llama)");
  visit("seq_len", m.seq_len, "context length");
  visit("vocab_size", m.vocab_size, "vocabulary size");
  visit("tie_word_embeddings", m.tie_word_embeddings,
        "the head reads the token embedding's table, no head of its own (llama-style families; gpt2 always ties)");
  visit("norm_eps", m.norm_eps, "LayerNorm (gpt2) or RMSNorm (llama) epsilon");
  visit("rope_theta", m.rope_theta, "rotary base (llama)");
  visit("rope_scaling", m.rope_scaling.type, "rotary frequency scaling: none or llama3 (Llama 3.1)");
  visit("rope_factor", m.rope_scaling.factor, "llama3 scaling: factor");
  visit("rope_low_freq_factor", m.rope_scaling.low_freq_factor, "llama3 scaling: low_freq_factor");
  visit("rope_high_freq_factor", m.rope_scaling.high_freq_factor, "llama3 scaling: high_freq_factor");
  visit("rope_original_max_position", m.rope_scaling.original_max_position,
        "llama3 scaling: original_max_position_embeddings");
  visit("sliding_window", m.sliding_window,
        "sliding-window attention (mistral): each token sees the N latest tokens, itself included (0: all earlier)");
  visit("n_experts", m.n_experts, "mixture of experts (mixtral, qwen3_moe): experts per block (0: the family's default)");
  visit("n_experts_per_token", m.n_experts_per_token, "mixture of experts: experts each token is routed to, top-k (0: the family's, mixtral 2, qwen3_moe 8)");
  visit("moe_ffn_dim", m.moe_ffn_dim, "mixture of experts: each expert's hidden width (0: ffn_dim)");
  visit("moe_norm_topk", m.moe_norm_topk, "mixture of experts: divide the top-k routing weights by their sum");
  visit("moe_router_score", m.moe_router_score,
        "mixture of experts: the router's scores, softmax or sigmoid (each expert's own; the balance loss on their "
        "normalized values)");
  visit("moe_router_bias_update_rate", m.moe_router_bias_update_rate,
        "mixture of experts: loss-free balancing (DeepSeek-V3's): each expert's bias, added to its score for the "
        "choice only, moves by this much after each step, up if its load was below the mean, down if above (0: off)");
  visit("moe_capacity_factor", m.moe_capacity_factor,
        "mixture of experts: each expert takes at most ceil(factor x seq_len x top-k / experts) of a sequence's tokens, "
        "the rest dropped (0: dropless)");
  visit("moe_token_drop_policy", m.moe_token_drop_policy,
        "mixture of experts, over capacity: drop the tokens of lowest routing weight (probs) or the latest ones (position)");
  visit("moe_dropless_headroom", m.moe_dropless_headroom,
        "mixture of experts, dropless under expert parallelism: the rows a rank's experts hold, and the memory plan "
        "counts, as a multiple of the balanced share (at most ep); rows beyond it are held as routed, with a warning");
  visit("router_aux_loss_coef", m.router_aux_loss_coef, "mixture of experts: load-balancing loss coefficient");
  visit("router_z_loss_coef", m.router_z_loss_coef, "mixture of experts: router z-loss coefficient");
}

struct ParallelConfig {
  int dp = 0;               // data-parallel size; 0: world / (tp * cp * pp)
  int tp = 1;               // tensor-parallel size
  int cp = 1;               // context-parallel size: each sequence split over cp ranks (ring attention)
  int ep = 1;               // expert-parallel size: a mixture's experts split over ep of the dp x cp ranks
  int pp = 1;               // pipeline stages
  std::string pp_layers;    // layers per stage, "3,3,2"; empty: balanced
  Schedule schedule = Schedule::one_f_one_b;  // pipeline schedule: 1f1b, gpipe, interleaved or zb1
  int vpp = 1;              // model chunks per pipeline rank (interleaved: stage s holds chunks s, s+pp, ...)
  int zero = 0;             // 1: optimizer state sharded over dp (ZeRO-1); 2: gradients too; 3: parameters too
  int shard_size = 0;       // ZeRO over groups of this many dp ranks, replicated across them; 0: all of dp
  bool sequence_parallel = false;  // Megatron's sequence parallelism (needs tp > 1)
  double bucket_mb = 25;    // size of the gradient buckets reduced during backward
  bool overlap = true;      // start a bucket's reduction as soon as its gradients are final
  int ranks_per_node = 0;   // 0: ranks sharing a machine form a node; N: N consecutive ranks
  double timeout_s = 600;   // bound on every blocking wait

  // The size of every axis of the rank grid (parallel/parallel_dims.h), as set.
  std::vector<AxisSize> axis_sizes() const { return {{Axis::dp, dp}, {Axis::pp, pp}, {Axis::cp, cp}, {Axis::tp, tp}}; }
};

struct TrainConfig {
  int steps = 500;          // optimizer steps
  int global_batch = 16;    // sequences per optimizer step over all dp ranks
  int micro_batch = 0;      // sequences per forward/backward on one rank; 0: global_batch / dp
  double lr = 1e-3;         // peak learning rate
  double min_lr = 1e-4;     // end of the decay
  int warmup_steps = 50;    // linear warmup from 0
  LrShape lr_schedule = LrShape::cosine;  // cosine | linear | constant | wsd (optim/lr_schedule.h)
  int lr_decay_steps = 0;   // the step at which the decay reaches min_lr; 0: steps
  double wsd_decay = 0.2;   // wsd: its final decay, in steps (>= 1) or a fraction of the steps after warmup (< 1)
  std::string optimizer = "adamw";  // a registered optimizer (optim/: adamw, lion)
  double weight_decay = 0.1;  // decoupled, matrices and embeddings only
  double grad_clip = 1.0;   // global-norm clipping; 0 disables
  double beta1 = 0.9;       // AdamW's and Lion's
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  uint64_t seed = 1234;     // initialization and data order
  Device device = Device::cpu;
  PrecisionSetting precision = PrecisionSetting::automatic;  // fp32 | bf16 (fp32 master weights) | auto: bf16 on cuda, fp32 on cpu
  Recompute recompute = Recompute::none;  // none | selective (attention's core) | full (each layer in backward)
  // full: the layers of each model chunk recomputed (Megatron's --recompute-num-layers);
  // 0: every layer. Which ones: recompute_method (model/activations.h).
  int recompute_layers = 0;
  RecomputeMethod recompute_method = RecomputeMethod::block;  // block: the chunk's first N | uniform: spread evenly
  // "full", "full (4 layers per chunk, block)", ...: for reports.
  std::string recompute_description() const;
  int max_bad_steps = 5;            // non-finite steps in a row before going back to the last checkpoint
  double spike_factor = 3.0;        // report a loss above this times its running mean; 0: never
  // Every N steps the dp replicas' parameters are hashed and compared (silent data
  // corruption: train/replica_check.h); 0: never.
  int replica_check_steps = 1000;

  int accumulation_steps(int dp) const { return global_batch / dp / micro_batch; }
  int decay_end() const { return lr_decay_steps > 0 ? lr_decay_steps : steps; }
  // precision with "auto" resolved for the device
  kernels::Precision resolved_precision() const {
    if (precision == PrecisionSetting::automatic) return device == Device::cuda ? kernels::Precision::bf16 : kernels::Precision::fp32;
    return precision == PrecisionSetting::bf16 ? kernels::Precision::bf16 : kernels::Precision::fp32;
  }
};

struct DataConfig {
  // A Megatron dataset prefix, llm.c shards (a glob), text (a file or folder), or a blend
  // "w1 p1 w2 p2" (data/token_dataset.h).
  std::string path = "/usr/share/games/fortunes";
  TokenizerKind tokenizer = TokenizerKind::byte;    // byte | gpt2 | llama3 | sentencepiece (data/tokenizer.h)
  std::string tokenizer_path;                       // gpt2: folder of encoder.json + vocab.bpe, or .tiktoken;
                                                    // llama3: tokenizer.model; sentencepiece: .model
  std::string json_key = "text";                    // the document's key in JSONL input (Megatron's --json-keys)
  double val_fraction = 0.05;                       // held-out tail of the documents
  std::string val_path;                             // a validation dataset of its own (instead of val_fraction)
  // Where each node keeps its copy of data in S3 (an s3:// data.path or val_path):
  // empty: $SLURM_TMPDIR/trident-data under Slurm, else /tmp/trident-data (data/s3_data.h).
  std::string cache_dir;
  // The S3-compatible store of s3:// data (http(s)://host:port); empty: checkpoint.s3_endpoint's,
  // else AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS S3 (storage/s3_endpoint.h).
  std::string s3_endpoint;
  // s3:// Megatron prefixes read with ranged GETs as training needs them instead of copied
  // first (data/s3_stream.h), each rank keeping up to stream_cache_mb of fetched ranges.
  bool stream = false;
  int stream_cache_mb = 256;
  // Copied (not streamed): training starts once the small files are there, reading each
  // Megatron token file with ranged GETs while the node leader copies it in the background,
  // and from the copy once it is complete and verified; true: every copy complete first.
  bool wait_for_copy = false;
  // Attention stays within each document (Llama 3's packing): a token sees the earlier
  // tokens of its own document only; a document ends with eod_token, which belongs to it.
  bool document_mask = false;
  int eod_token = -1;  // the end-of-document id; -1: the tokenizer's (its eos)
};

struct CheckpointConfig {
  std::string dir;         // where step_NNNNNNNN/ directories go; empty: no checkpoints
  int every_steps = 0;     // save every N steps (and at the end); 0: only on a signal
  int keep_last = 3;       // complete checkpoints kept; 0: all
  bool async = false;      // write node files in the background while training goes on
  // The memory tier (ckpt/memory_tier.h): each rank's state in node memory every N steps,
  // with a copy on the partner node (0: off; needs dir, where the disk tier writes), in
  // memory_dir (a tmpfs on every node).
  int memory_every_steps = 0;
  std::string memory_dir = "/dev/shm";
  std::string load;        // a step directory to start from (default: dir/latest, if any)
  std::string init_from;   // an exported HDF5 (params/<name>) to initialize the parameters
  // One folder, one run (ckpt/checkpoint_lease.h): the run's lease on `dir` is renewed at
  // step ends; one not renewed for this long is stale, and another run may take the folder
  // over. 0: auto = max(parallel.timeout_s, 4 x the longest step so far, its save
  // included): a live run renews within it (a rank stuck longer has ended the job through
  // the timeout), and a run on another machine whose holder died waits at most that long.
  double lease_s = 0;
  // The second tier (ckpt/checkpoint_upload.h): s3://bucket/prefix; empty: disk only.
  std::string upload;
  std::string s3_endpoint;       // an S3-compatible store's http(s)://host:port; empty: AWS_ENDPOINT_URL_S3,
                                 // AWS_ENDPOINT_URL, else AWS (storage/s3_endpoint.h)
  std::string s3_region;         // empty: AWS_REGION, AWS_DEFAULT_REGION, ~/.aws/config, the instance's
  int s3_part_mb = 64;           // multipart part size (S3's minimum: 5 MiB; grown past 10,000 parts)
  int s3_parallel = 8;           // parts in flight per node file
  double s3_retry_s = 120;       // one request retried (503 Slow Down, no answer) this long
  double upload_timeout_s = 90;  // the end of a run waits this long for its last upload, then exit 3
};

struct LogConfig {
  std::string run_dir = "runs/default";  // metrics.jsonl goes here
  int every_steps = 10;                  // print/log every N steps (and the last)
  double straggler_factor = 1.2;         // report the slowest rank above this times its stage's median; 0: never
  int straggler_limit = 0;               // the same straggler this many log steps in a row ends the run (exit 3,
                                         // its host named: health/); 0: report only
  int gpu_error_limit = 2;               // log steps at which a machine's GPU XID/ECC counts rose before the run
                                         // ends (exit 3, its host named); 0: warn only
  int val_every_steps = 0;               // validation loss every N steps; 0: at the end only
  int val_batches = 4;                   // batches of the validation split per evaluation
  int sample_every_steps = 0;            // print a greedy sample of the model every N steps; 0: never
  double peak_gflops = 0;                // for MFU; 0: measure sgemm at start
  std::string tensorboard_dir;           // TensorBoard event files; empty: <run_dir>/tensorboard; "none": off
  bool expert_tokens_per_layer = false;  // a mixture of experts: tokens per expert of each layer, beside their sum
  int metrics_port = 0;                  // Prometheus endpoint http://host:PORT/metrics; 0: off
  std::string trace_steps;               // "A:B": a Chrome trace of steps A..B (from 1); empty: none

  // Where TensorBoard's files go: "" when off.
  std::string tensorboard_folder() const;
  // log.trace_steps as (first, last), from 1; (0, 0) when off. UsageError on a bad range.
  std::pair<int, int> trace_range() const;
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  DataConfig data;
  CheckpointConfig checkpoint;
  LogConfig log;

  // Checks values that cannot work; throws UsageError naming the key.
  void validate() const;
  // Fills in what depends on the world size (dp, micro_batch) and checks the layout.
  void resolve_layout(int world_size);
  // The grid of the resolved layout (after resolve_layout).
  ParallelDims dims() const;
  // INI text of every key, as printed at start.
  std::string to_ini() const;
};

// The command line of one subcommand: `trident <command> [--config F] [--section.key=v]
// ...` plus that command's own options. Throws UsageError on unknown keys, bad values,
// missing files. `help` is set (and nothing else parsed) when --help was given.
struct CommandLine {
  std::string command;
  Config config;
  bool help = false;
  std::string help_text;
  std::string reference;  // verify: --reference FILE.h5
  // The config keys ("parallel.tp") given by a flag or in the config file; not those left
  // at their defaults nor those from defaults_ini (`trident plan` keeps them as set).
  std::set<std::string> given;
};

// A command's own options (tokenize's --decode, prepare's --input, ...): parsed out of
// `args`; what is left (config keys, --config) is returned for parse_command_line.
// UsageError on a bad value, with `usage` appended.
std::vector<std::string> take_command_options(const std::vector<std::string>& args,
                                              const boost::program_options::options_description& own,
                                              const std::string& usage = "");

// defaults_ini: INI text below the config file and the flags (a checkpoint's config).
CommandLine parse_command_line(const std::string& command, const std::vector<std::string>& args,
                               const std::string& defaults_ini = "");

}  // namespace trident
