// The transformer spec as pure arithmetic: what each family is made of, the parameter
// counts and FLOPs of the published shapes (the shipped configs), the tensor-parallel
// sharding of grouped-query attention, Llama 3.1's rotary scaling against Hugging
// Face's formula, and one clear error for each shape a family cannot have.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "config/config.h"
#include "model/hf_conventions.h"
#include "model/parameters.h"
#include "model/transformer_spec.h"
#include "kernels/base/error.h"

namespace trident {
namespace {

ModelConfig config_of(const std::string& file) {
  return parse_command_line("train", {"--config", file}).config.model;
}

std::string error_of(const ModelConfig& m, int tp = 1) {
  try {
    check_tensor_parallel(transformer_spec(m), tp);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(TransformerSpec, PublishedParameterCounts) {
  // Hugging Face's parameter counts of the released checkpoints.
  const std::pair<const char*, int64_t> published[] = {
      {"configs/gpt2-124m.ini", 124439808},    {"configs/llama2-7b.ini", 6738415616},
      {"configs/llama2-13b.ini", 13015864320}, {"configs/llama2-70b.ini", 68976648192},
      {"configs/llama3-8b.ini", 8030261248},   {"configs/llama3-70b.ini", 70553706496},
      {"configs/mixtral-8x7b.ini", 46702792704}};
  for (const auto& [file, count] : published) EXPECT_EQ(parameter_count(transformer_spec(config_of(file))), count) << file;
  // Mixtral's active parameters ("12.9B"): 2 of the 8 experts of each layer, everything else.
  const int64_t experts = 32LL * 8 * 3 * 4096 * 14336;
  EXPECT_EQ(active_parameter_count(transformer_spec(config_of("configs/mixtral-8x7b.ini"))),
            46702792704 - experts + experts / 4);
}

// "30.5" rounded as published: to as many decimals as the published figure has.
bool rounds_to(double billions, const std::string& published) {
  const size_t dot = published.find('.');
  const int decimals = dot == std::string::npos ? 0 : static_cast<int>(published.size() - dot - 1);
  const double scale = std::pow(10.0, decimals);
  return std::abs(std::round(billions * scale) / scale - std::stod(published)) < 0.5 / scale;
}

// Each shipped config of a published model is that model: its family's config.json as
// published (tests/hf/published/, from the model cards' repositories) describes it (no
// mismatch: head_dim, tie_word_embeddings, experts, rope scaling, ...), and the counts that
// `trident plan` prints round to the published ones (total, active per token, and the Qwen
// model cards' count without the embedding and head).
TEST(TransformerSpec, ShippedConfigsAreThePublishedModels) {
  struct Published {
    const char *config, *hf, *total, *active, *non_embedding;  // billions; "" where not published
    bool active_without_router = false;  // the published active count leaves the router out
  };
  const Published models[] = {
      // Qwen3 model cards: "Number of Parameters", "(Non-Embedding)", "activated".
      {"qwen3-0.6b", "Qwen3-0.6B", "0.6", "", "0.44"},
      {"qwen3-8b", "Qwen3-8B", "8.2", "", "6.95"},
      {"qwen3-32b", "Qwen3-32B", "32.8", "", "31.2"},
      // Qwen's "activated" leaves the router out: 3.353B with it (what a token passes
      // through, as plan counts it), 3.340B without (48 x 2048 x 128 fewer).
      {"qwen3-30b-a3b", "Qwen3-30B-A3B", "30.5", "3.3", "29.9", true},
      {"qwen3-235b-a22b", "Qwen3-235B-A22B", "235", "22", "234", true},
      // Hugging Face's count of the weights (Mistral 7B, Llama 3.1), Mistral's announcements.
      {"mistral-7b", "Mistral-7B-v0.1", "7.24", "", ""},
      {"mixtral-8x7b", "Mixtral-8x7B-v0.1", "46.7", "12.9", ""},
      {"mixtral-8x22b", "Mixtral-8x22B-v0.1", "141", "39", ""},
      {"llama3.1-70b", "Llama-3.1-70B", "70.6", "", ""},
      {"llama3.1-405b", "Llama-3.1-405B", "406", "", ""},
      // OLMo 2 7B: Hugging Face's count of the weights (7.30B).
  };
  for (const Published& m : models) {
    SCOPED_TRACE(m.config);
    const TransformerSpec spec = transformer_spec(config_of(std::string("configs/") + m.config + ".ini"));
    std::ifstream file(std::string("tests/hf/published/") + m.hf + ".json");
    ASSERT_TRUE(file.good()) << m.hf;
    const nlohmann::json published = nlohmann::json::parse(file);
    EXPECT_EQ(hf_config_mismatches(published, spec), std::vector<std::string>{});
    const double total = parameter_count(spec) / 1e9, active = active_parameter_count(spec) / 1e9;
    EXPECT_TRUE(rounds_to(total, m.total)) << total << " vs " << m.total;
    const double router = m.active_without_router ? 1e-9 * spec.n_layer * spec.d_model * spec.n_experts : 0;
    if (*m.active) EXPECT_TRUE(rounds_to(active - router, m.active)) << active - router << " vs " << m.active;
    if (!*m.active) EXPECT_EQ(active, total);
    if (*m.non_embedding) {
      const double tables = (spec.tied_head ? 1.0 : 2.0) * spec.vocab_size * spec.d_model / 1e9;
      EXPECT_TRUE(rounds_to(total - tables, m.non_embedding)) << total - tables << " vs " << m.non_embedding;
    }
    // What plan prints.
    char expected[80];
    std::snprintf(expected, sizeof expected, *m.active ? "%.2fB parameters, %.2fB active" : "%.2fB parameters", total,
                  active);
    EXPECT_EQ(parameter_summary(spec), expected);
  }
  // The heads' own width, and the tied table (no lm_head): Qwen3 0.6B's 28 blocks are
  // 0.44B, its one table 0.16B.
  const TransformerSpec small = transformer_spec(config_of("configs/qwen3-0.6b.ini"));
  EXPECT_EQ(small.head_dim, 128);
  EXPECT_EQ(small.attention_width(), 2048);
  EXPECT_TRUE(small.tied_head);
  EXPECT_FALSE(ParameterLayout(small).has("lm_head.weight"));
  // Without head_dim, Qwen3-30B-A3B's heads would be 2048 / 32 = 64 wide: its config.json says otherwise.
  ModelConfig narrow = config_of("configs/qwen3-30b-a3b.ini");
  narrow.head_dim = 0;
  std::ifstream file("tests/hf/published/Qwen3-30B-A3B.json");
  const std::vector<std::string> bad = hf_config_mismatches(nlohmann::json::parse(file), transformer_spec(narrow));
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0], "head_dim = 128, but model.head_dim = 64");
}

TEST(TransformerSpec, FlopsPerTokenCountTheMatmulsOnce) {
  // GPT-2 124M: 6 N + 12 L T d with N without wpe: 855 MFLOP (shared/MACHINE.md).
  EXPECT_NEAR(flops_per_token(transformer_spec(config_of("configs/gpt2-124m.ini"))) / 1e6, 855.0, 1.0);
  // Llama 2 7B: N without the (untied) token embedding, T = 4096.
  const TransformerSpec llama = transformer_spec(config_of("configs/llama2-7b.ini"));
  const double n = 6738415616.0 - 32000.0 * 4096;
  EXPECT_DOUBLE_EQ(flops_per_token(llama), 6 * n + 12.0 * 32 * 4096 * 4096);
}

TEST(TransformerSpec, FamiliesDifferOnlyWhereTheyDiffer) {
  ModelConfig m;
  const TransformerSpec gpt2 = transformer_spec(m);
  EXPECT_EQ(gpt2.positions, PositionKind::learned);
  EXPECT_EQ(gpt2.mlp, MlpKind::gelu);
  EXPECT_TRUE(gpt2.tied_head);
  const ParameterLayout gpt2_whole(gpt2);  // LayerNorm with a bias, biases on the projections
  EXPECT_TRUE(gpt2_whole.has("h.0.ln_1.bias") && gpt2_whole.has("h.0.attn.c_attn.bias"));
  EXPECT_EQ(gpt2.ffn_dim, 4 * m.d_model);
  m.family = "llama";
  const TransformerSpec llama = transformer_spec(m);
  EXPECT_EQ(llama.positions, PositionKind::rotary);
  EXPECT_EQ(llama.mlp, MlpKind::swiglu);
  EXPECT_FALSE(llama.tied_head);
  const ParameterLayout llama_whole(llama);  // RMSNorm, no biases
  for (const ParameterTensor& t : llama_whole.tensors()) EXPECT_EQ(t.name.find(".bias"), std::string::npos) << t.name;
  EXPECT_EQ(llama.ffn_dim, 512);  // 2/3 of 4 * 128 = 341, rounded up to 256s
  EXPECT_EQ(llama.n_kv_head, llama.n_head);  // 0: plain multi-head
  // The same layout machinery: names from FORMAT.md, q | k | v and gate | up adjacent.
  m.n_kv_head = 2;
  const ParameterLayout layout(m);
  EXPECT_EQ(layout.tensors().size(), 4u * 9 + 3);
  const ParameterTensor& q = layout.tensor("model.layers.0.self_attn.q_proj.weight");
  const ParameterTensor& k = layout.tensor("model.layers.0.self_attn.k_proj.weight");
  const ParameterTensor& v = layout.tensor("model.layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(k.shape, (std::vector<int64_t>{2 * 32, 128}));
  EXPECT_EQ(k.offset, q.offset + q.stored);
  EXPECT_EQ(v.offset, k.offset + k.stored);
  const ParameterTensor& gate = layout.tensor("model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(layout.tensor("model.layers.0.mlp.up_proj.weight").offset, gate.offset + gate.stored);
  EXPECT_EQ(layout.tensors().back().name, "lm_head.weight");
  for (const ParameterTensor& t : layout.tensors()) {
    EXPECT_FALSE(t.placement.summed_over.has(MeshAxis::pp_ends)) << t.name;  // nothing tied
    // Decay on matrices and embeddings; every tensor but the untied embedding multiplied.
    EXPECT_EQ(t.placement.weight_decay, t.shape.size() == 2) << t.name;
    EXPECT_EQ(t.placement.multiplied, t.name != "model.embed_tokens.weight") << t.name;
  }
  // GPT-2's: the head reads the token table, which the first and last stage both hold.
  m.family = "gpt2";
  m.n_kv_head = 0;
  const ParameterLayout gpt2_layout(m);
  EXPECT_TRUE(gpt2_layout.tensor("wte.weight").placement.summed_over.has(MeshAxis::pp_ends));
  EXPECT_TRUE(gpt2_layout.tensor("wte.weight").placement.multiplied);
  EXPECT_FALSE(gpt2_layout.tensor("wpe.weight").placement.multiplied);
  EXPECT_FALSE(gpt2_layout.has("lm_head.weight"));
  const StageSpec last{{LayerRange{2, -1}}, /*has_embedding=*/false, /*has_head=*/true};
  const ParameterLayout last_stage(transformer_spec(m), 0, 1, 1, last);
  EXPECT_EQ(last_stage.tensors().front().name, "wte.weight");  // a copy, in the first unit: not counted
  EXPECT_FALSE(last_stage.tensors().front().placement.counted);
  EXPECT_FALSE(last_stage.has("wpe.weight"));
}

// The model line names what sets a family apart: Mistral's sliding window too.
TEST(TransformerSpec, DescriptionNamesTheSlidingWindow) {
  ModelConfig m;
  m.family = "mistral";
  m.n_kv_head = 2;
  m.sliding_window = 7;
  EXPECT_EQ(transformer_spec(m).describe(), "mistral L4 H4 KV2 d128 T128 V256 window 7");
  m.sliding_window = 0;  // all earlier tokens: nothing to name
  EXPECT_EQ(transformer_spec(m).describe(), "mistral L4 H4 KV2 d128 T128 V256");
}

TEST(TransformerSpec, KeyValueHeadsSplitOrAreSharedOverTp) {
  ModelConfig m;
  m.family = "llama";
  m.n_head = 8;
  m.n_kv_head = 2;
  m.d_model = 64;
  m.ffn_dim = 64;
  // tp 2: one key/value head per rank; tp 8: each held by 4 ranks, gradients partial.
  for (int tp : {1, 2, 4, 8}) {
    for (int r = 0; r < tp; r++) {
      const ParameterLayout layout(transformer_spec(m), r, tp);
      const ParameterTensor& k = layout.tensor("model.layers.0.self_attn.k_proj.weight");
      const int shards = tp <= 2 ? tp : 2;
      EXPECT_EQ(k.placement.pieces, shards) << "tp " << tp;
      EXPECT_EQ(k.placement.piece, r / (tp / shards)) << "tp " << tp << " rank " << r;
      EXPECT_EQ(k.placement.summed_over.has(MeshAxis::tp_piece), tp > 2);
      EXPECT_EQ(k.placement.counted, r % (tp / shards) == 0);
      EXPECT_EQ(k.stored, static_cast<size_t>(2 / shards * 8 * 64));
      const ParameterTensor& norm = layout.tensor("model.layers.0.input_layernorm.weight");
      EXPECT_EQ(norm.placement.counted, r == 0);  // replicated: rank 0's copy counts
      // Every rank computes all of it (summed over tp only under sequence parallelism).
      EXPECT_EQ(norm.placement.model_sums(), AxisSet{MeshAxis::sp});
    }
  }
  EXPECT_EQ(error_of(m, 8), "");
  EXPECT_NE(error_of(m, 3).find("parallel.tp (3) must divide model.n_head"), std::string::npos);
  m.n_head = 12;
  m.n_kv_head = 4;
  m.d_model = 96;
  m.ffn_dim = 96;
  EXPECT_EQ(error_of(m, 12), "");  // 3 ranks per head
  EXPECT_NE(error_of(m, 6).find("do not fit"), std::string::npos);  // 4 heads over 6 ranks: neither way
}

TEST(TransformerSpec, Llama31RopeScalingMatchesHuggingFace) {
  ModelConfig m = config_of("configs/llama3-8b.ini");
  m.rope_scaling.type = "llama3";  // factor 8, low 1, high 4, original context 8192
  const std::vector<double> f = rotary_frequencies(transformer_spec(m).rotary());
  ASSERT_EQ(f.size(), 64u);
  // transformers' _compute_llama3_parameters (float64), pairs 0, 20 (kept), 30
  // (blended), 40, 44, 48, 63 (slowed by 8).
  const std::pair<int, double> expected[] = {{0, 1.0},
                                             {20, 0.016560440080994446},
                                             {30, 0.001371893567761138},
                                             {40, 3.428102195952591e-05},
                                             {44, 1.509621717643313e-05},
                                             {48, 6.647869871181236e-06},
                                             {63, 3.068925988914511e-07}};
  for (const auto& [i, want] : expected) EXPECT_NEAR(f[i], want, 1e-14 * want) << "pair " << i;
  m.rope_scaling.type = "none";
  EXPECT_NEAR(rotary_frequencies(transformer_spec(m).rotary())[40], 0.0002742481756762073, 1e-18);
}

TEST(TransformerSpec, ShapesAFamilyCannotHaveAreNamed) {
  ModelConfig m;
  m.family = "llama";
  m.n_kv_head = 3;  // of 4 heads
  EXPECT_NE(error_of(m).find("model.n_kv_head (3) must divide model.n_head (4)"), std::string::npos);
  m.n_kv_head = 2;
  m.d_model = 4 * 33;  // head dimension 33: rotary embeddings turn pairs
  EXPECT_NE(error_of(m).find("must be even"), std::string::npos);
  m = ModelConfig{};
  m.n_kv_head = 2;  // GPT-2 has no grouped-query attention
  EXPECT_NE(error_of(m).find("model.n_kv_head"), std::string::npos);
  m = ModelConfig{};
  m.family = "llama";
  m.ffn_dim = 102;  // over 4 ranks
  EXPECT_NE(error_of(m, 4).find("model.ffn_dim"), std::string::npos);
  // A sliding window is Mistral's; an unknown family is named with the registered ones.
  for (const std::string family : {"gpt2", "llama", "qwen2", "qwen3"}) {
    m = ModelConfig{};
    m.family = family;
    m.sliding_window = 8;
    EXPECT_NE(error_of(m).find("model.sliding_window applies to model.family = mistral"), std::string::npos) << family;
  }
  m.family = "mistral";
  EXPECT_EQ(error_of(m), "");
  // head_dim: a llama-style family's own width (d_model then need not divide by n_head);
  // GPT-2's heads are d_model / n_head wide.
  m = ModelConfig{};
  m.family = "qwen3";
  m.d_model = 102;  // not 4 heads of a whole width
  EXPECT_NE(error_of(m).find("must be a multiple of model.n_head"), std::string::npos);
  m.head_dim = 32;
  EXPECT_EQ(error_of(m), "");
  EXPECT_EQ(transformer_spec(m).attention_width(), 128);
  m.head_dim = 33;  // rotary embeddings turn pairs
  EXPECT_NE(error_of(m).find("(model.head_dim, or model.d_model / model.n_head: 33) must be even"), std::string::npos);
  m = ModelConfig{};
  m.head_dim = 64;  // gpt2, 4 heads of 128 / 4
  EXPECT_NE(error_of(m).find("model.head_dim (64) applies to the llama-style families"), std::string::npos);
  m.family = "mamba";
  EXPECT_EQ(error_of(m), "model.family must be gpt2, llama, mistral, mixtral, olmo2, qwen2, qwen3 or qwen3_moe, got 'mamba'");
}

// A mixture of experts' keys on a dense family are refused, named, like n_experts; at their
// defaults (a printed config, a dense config file) they are not asked for and pass.
TEST(TransformerSpec, ExpertKeysOnADenseFamilyAreNamed) {
  ModelConfig m;
  m.family = "llama";
  m.n_kv_head = 2;
  m.n_experts_per_token = 4;
  EXPECT_EQ(error_of(m), "model.n_experts_per_token applies to a mixture-of-experts family (mixtral, qwen3_moe), not llama");
  m.moe_capacity_factor = 1.25;
  m.router_z_loss_coef = 0.001;
  EXPECT_EQ(error_of(m), "model.n_experts_per_token, model.moe_capacity_factor, model.router_z_loss_coef apply to a "
                         "mixture-of-experts family (mixtral, qwen3_moe), not llama");
  for (const std::string& flag : {"--model.moe_ffn_dim=64", "--model.moe_norm_topk=false", "--model.moe_router_score=sigmoid",
                                  "--model.moe_token_drop_policy=position", "--model.router_aux_loss_coef=0.01",
                                  "--model.moe_dropless_headroom=3"}) {
    const ModelConfig dense = parse_command_line("train", {"--config", "configs/tiny-llama.ini", flag}).config.model;
    const std::string key = flag.substr(2, flag.find('=') - 2);
    EXPECT_EQ(error_of(dense), key + " applies to a mixture-of-experts family (mixtral, qwen3_moe), not llama") << flag;
    ModelConfig moe = dense;
    moe.family = "qwen3_moe";
    EXPECT_EQ(error_of(moe), "") << flag;
  }
  // Every key written out at its default, as the resolved config prints them all.
  const std::string printed = testing::TempDir() + "printed_dense.ini";
  std::ofstream(printed) << parse_command_line("train", {"--config", "configs/tiny-llama.ini"}).config.to_ini();
  EXPECT_EQ(error_of(config_of(printed)), "");
  EXPECT_EQ(error_of(config_of("configs/tiny.ini")), "");
  // A dense run's manifest from before top-k's default was the family's records 2.
  ModelConfig old = config_of("configs/tiny-llama.ini");
  old.n_experts_per_token = 2;
  EXPECT_EQ(error_of(old), "");
}

}  // namespace
}  // namespace trident
