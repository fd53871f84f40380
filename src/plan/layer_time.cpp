#include "plan/layer_time.h"

#include <algorithm>
#include <cmath>

namespace trident {

namespace {

constexpr double kBf16 = 2;  // bytes per activation and weight element

double hbm_bytes_per_s(const GpuModel& gpu) { return gpu.hbm_tbps * 1e12 * gpu.hbm_efficiency; }

// Forward, input gradient and weight gradient of one GEMM of `rows` x `in` by `in` x `out`.
PassTimes gemm_passes(double rows, double in, double out, const GpuModel& gpu) {
  return {gemm_seconds({rows, out, in}, gpu), gemm_seconds({rows, in, out}, gpu), gemm_seconds({in, out, rows}, gpu)};
}

}  // namespace

double gemm_efficiency(const GemmShape& s, const GpuModel& gpu) {
  const double size = std::cbrt(s.m * s.n * s.k);  // the cube of the same work
  return gpu.gemm_efficiency * size / (size + gpu.gemm_half_size);
}

double gemm_seconds(const GemmShape& s, const GpuModel& gpu) {
  const double flops = 2 * s.m * s.n * s.k;
  const double bytes = kBf16 * (s.m * s.k + s.k * s.n + s.m * s.n);
  return std::max(flops / (gpu.bf16_tflops * 1e12 * gemm_efficiency(s, gpu)), bytes / hbm_bytes_per_s(gpu));
}

LayerTimes layer_times(const TransformerSpec& spec, int micro_batch, int tp, bool sequence_parallel, const GpuModel& gpu,
                       const StepModelOptions& options) {
  const double rows = static_cast<double>(micro_batch) * spec.seq_len, d = spec.d_model;
  const double q = static_cast<double>(spec.attention_width()) / tp;
  const double kv = static_cast<double>(spec.n_kv_head) * spec.head_dim / spec.kv_shards(tp);  // k or v, per rank
  // A mixture of experts: each expert's GEMMs on the rows routed to it (K of every E, for a
  // balanced router), E of them, and the router's; per row, K experts' activations.
  const bool moe = spec.n_experts > 0;
  const double experts = moe ? spec.n_experts : 1;
  const double expert_rows = moe ? rows * spec.experts_per_token / spec.n_experts : rows;
  const double expert_width = moe ? static_cast<double>(spec.moe_ffn_dim) / tp : spec.mlp_activation_width(tp);
  const double expert_in = spec.mlp == MlpKind::swiglu ? 2 * expert_width : expert_width;
  const double routed = moe ? spec.experts_per_token : 1;  // experts each row passes through
  const double hidden = routed * expert_width, mlp_in = routed * expert_in;
  LayerTimes t;
  const auto add = [&t](const PassTimes& g, double times) {
    t.gemm_forward += times * g.forward;
    t.gemm_input_grad += times * g.input_gradient;
    t.gemm_weight_grad += times * g.weight_gradient;
  };
  add(gemm_passes(rows, d, q + 2 * kv, gpu), 1);
  add(gemm_passes(rows, q, d, gpu), 1);
  add(gemm_passes(expert_rows, d, expert_in, gpu), experts);
  const PassTimes mlp_out = gemm_passes(expert_rows, expert_width, d, gpu);
  add(mlp_out, experts);
  if (moe) add(gemm_passes(rows, d, experts, gpu), 1);  // the router
  // What full recomputation keeps (the MLP's output projection's input): an expert's down
  // GEMM runs again (its output is needed for the routing weights' gradient).
  t.mlp_out_forward = moe ? 0.0 : mlp_out.forward;
  const double hbm = hbm_bytes_per_s(gpu), T = spec.seq_len;
  if (options.flash_attention) {
    // Flash attention over this rank's heads, causal: half of the 4 B T^2 (H hd) FLOPs.
    const double attention_flops = 0.5 * 4.0 * micro_batch * T * T * q;
    const double attention_rate = gpu.bf16_tflops * 1e12 * gpu.attention_efficiency;
    t.attention_forward = attention_flops / attention_rate;
    t.attention_backward = 2.5 * attention_flops / attention_rate;
  } else {
    // Per head: scores Q K^T (T x T over hd) and their product with V (T x hd over T),
    // twice that backward; about 12 bytes per score forward (the GEMM writes it, softmax
    // reads and writes it, dropout reads it and writes it and its mask, the GEMM reads
    // it), twice that backward.
    const double heads = micro_batch * q / spec.head_dim;
    const double gemms = gemm_seconds({T, T, static_cast<double>(spec.head_dim)}, gpu) +
                         gemm_seconds({T, static_cast<double>(spec.head_dim), T}, gpu);
    t.attention_forward = heads * (gemms + T * T * 12 / hbm);
    t.attention_backward = heads * (2 * gemms + T * T * 24 / hbm);
  }
  // Bytes read and written per row in forward, fused kernels: two norms (read, write d
  // each), two residual adds (read 2 d, write d), the rotary embedding of q and k (read,
  // write), the MLP's activation (read its input, write its output); bf16. Eager PyTorch's
  // per element: RMSNorm 36 bytes (to fp32, square, mean, scale, back to bf16, times the
  // weight), rotary 28 (to fp32 complex, multiply, back), SwiGLU 10 per output (SiLU, then
  // the product). Backward moves about twice the forward's. The norms and residuals run on
  // 1/tp of the rows under sequence parallelism.
  const double rows_split = sequence_parallel ? tp : 1;
  const double rope_width = spec.positions == PositionKind::rotary ? q + kv : 0;
  const double bytes = options.eager_elementwise
                           ? (2 * 36 * d + 2 * 6 * d) / rows_split + 28 * rope_width + 10 * hidden
                           : (2 * 4 * d + 2 * 6 * d) / rows_split + 4 * rope_width + kBf16 * (mlp_in + hidden);
  t.elementwise_forward = rows * bytes / hbm;
  t.elementwise_backward = 2 * t.elementwise_forward;
  if (options.fp32_weight_casts) {
    // Read fp32, write bf16 per weight in forward (6 bytes); bf16 to fp32 per gradient in backward.
    const double weights = d * (q + 2 * kv) + q * d + experts * (d * expert_in + expert_width * d);
    t.elementwise_forward += weights * 6 / hbm;
    t.elementwise_backward += weights * 6 / hbm;
  }
  return t;
}

PassTimes head_times(const TransformerSpec& spec, int micro_batch, int tp, const GpuModel& gpu) {
  const double rows = static_cast<double>(micro_batch) * spec.seq_len;
  const double vocab = static_cast<double>(spec.padded_vocab(tp)) / tp;
  const PassTimes g = gemm_passes(rows, spec.d_model, vocab, gpu);
  // The cross-entropy reads the logits and writes their gradient in fp32 (4 bytes each),
  // after the forward wrote them: about three fp32 passes over the logits.
  const double loss = rows * vocab * 3 * 4 / hbm_bytes_per_s(gpu);
  return {g.forward + loss / 2, g.input_gradient + loss / 2, g.weight_gradient};
}

}  // namespace trident
