// What a model config is, once its family (model/families/) has read it: the shapes with
// the family's defaults filled in and checked, and what the planners (and the stage's
// setup) read of the family's model: the positions (a learned table, or rotary
// embeddings), the MLP (GELU, or SwiGLU's gate and up), whether the head is tied to the
// token embedding. The layers (their norms, biases, ...), their tensors' names and
// placements come from the family; the parameter layout, FLOP count and checkpoint names
// derive from them.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "model/layers/rotary.h"

namespace trident {

enum class NormKind { layernorm, rmsnorm };  // a Norm layer's (model/layers/norm.h)
enum class MlpKind { gelu, swiglu };
enum class PositionKind { learned, rotary };

struct TransformerSpec {
  std::string family = "gpt2";  // its registered name (model.family)
  int n_layer = 0, n_head = 0, n_kv_head = 0, head_dim = 0, d_model = 0, ffn_dim = 0, seq_len = 0, vocab_size = 0;
  double norm_eps = 1e-5;
  PositionKind positions = PositionKind::learned;
  MlpKind mlp = MlpKind::gelu;
  bool tied_head = true;  // the head reads the token embedding's rows
  // Rotary embeddings: theta^(-2i/hd) per pair i, scaled as Llama 3.1 does with "llama3".
  double rope_theta = 10000;
  RopeScaling rope_scaling;
  int sliding_window = 0;  // attention over the latest N tokens (mistral); 0: all earlier ones
  // A mixture of experts in place of the MLP (mixtral, qwen3_moe): E experts of moe_ffn_dim,
  // K per token; 0 experts: dense.
  int n_experts = 0, experts_per_token = 0, moe_ffn_dim = 0;

  int attention_width() const { return n_head * head_dim; }      // of q and of the attention output
  // How the attention layers turn q and k (rotary positions): each head's channels, at rope_theta and rope_scaling.
  RotarySettings rotary() const { return {head_dim, rope_theta, rope_scaling}; }
  // The MLP's hidden width, and its input GEMM's output (gate | up under SwiGLU), on
  // one of `tp` ranks (column-parallel: each holds 1/tp of the columns).
  int mlp_activation_width(int tp = 1) const { return ffn_dim / tp; }
  int mlp_in_width(int tp = 1) const { return mlp == MlpKind::swiglu ? 2 * mlp_activation_width(tp) : mlp_activation_width(tp); }
  // Rows of the token table and columns of the logits: V rounded up to a multiple of 64
  // per tensor-parallel shard (whole vector tiles); the padded logits are masked.
  int padded_vocab(int tp) const { return (vocab_size + 64 * tp - 1) / (64 * tp) * (64 * tp); }
  // Distinct key/value head shards over tp: tp of them, or n_kv_head when tp exceeds it
  // (each then held by tp / n_kv_head ranks).
  int kv_shards(int tp) const { return tp <= n_kv_head ? tp : n_kv_head; }
  // "gpt2 L12 H12 d768 T1024 V50257", with kv heads and the MLP width for Llama.
  std::string describe() const;
  // The config it was made from, the family's defaults filled in (n_kv_head, ffn_dim):
  // what Hugging Face's config.json records.
  ModelConfig config;
};

// The spec of a model config, by its family; UsageError naming the key for what the
// family cannot be (or for a family that is not registered).
TransformerSpec transformer_spec(const ModelConfig& config);
// The tensor-parallel sizes the model can be split over; UsageError naming the keys.
void check_tensor_parallel(const TransformerSpec& spec, int tp);

// Model FLOPs per trained token, as the field counts them (PaLM, Megatron, torchtitan):
// 6 N + 12 L T (H hd), N the parameters that take part in matrix multiplies (their
// placement says): all but the lookup tables (GPT-2's wpe, and Llama's untied token
// embedding), an expert's weights K / E times (the active parameters).
double flops_per_token(const TransformerSpec& spec);
int64_t parameter_count(const TransformerSpec& spec);
// The parameters a token passes through: all but the experts it is not routed to (each
// expert's counted K / E times). parameter_count() for a dense model.
int64_t active_parameter_count(const TransformerSpec& spec);
// "46.70B parameters, 12.88B active" (a dense model: "8.03B parameters"), as `plan` prints it.
std::string parameter_summary(const TransformerSpec& spec);

// What one rotary table of a whole sequence takes (model/layers/rotary.h: cos and sin of
// each of the head_dim / 2 pairs, a row per position), as the memory plan counts it.
size_t rope_table_floats(const TransformerSpec& spec);

}  // namespace trident
