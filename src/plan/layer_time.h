// The time of one micro-batch's passes through a transformer's layers on one GPU, from the
// shapes of its GEMMs (plan/hardware.h states the rates):
//   GEMMs      qkv, attention out, MLP in (gate | up under SwiGLU), MLP out, the head: M =
//              micro_batch * seq_len rows, K and N split over tp as Megatron splits them;
//              forward (M, N, K), input gradient (M, K, N), weight gradient (K, N, M); each
//              max(FLOPs / (peak * efficiency(shape)), bytes / HBM bandwidth);
//   attention  flash attention: 4 B T^2 (H hd) FLOPs forward per layer, half of it under the
//              causal mask, backward 2.5 times the forward;
//   elementwise norms, residual adds, rotary embedding, the MLP's activation, the loss over
//              the logits: bytes read and written at HBM bandwidth.
// The weight-gradient GEMMs are apart: the zero-bubble schedule moves them (plan/schedule_time.h).
#pragma once

#include "model/transformer_spec.h"
#include "plan/hardware.h"
#include "pipeline/schedule_timing.h"

namespace trident {

struct GemmShape {
  double m = 0, n = 0, k = 0;  // (m x k) times (k x n)
};
// The share of the GPU's peak a GEMM of this shape reaches (plan/hardware.h: a saturating
// function of the edge of the cube of its work, (M N K)^(1/3)), and its time in seconds:
// the longer of its FLOPs at that rate and its bytes at HBM bandwidth.
double gemm_efficiency(const GemmShape& shape, const GpuModel& gpu);
double gemm_seconds(const GemmShape& shape, const GpuModel& gpu);

// How a framework runs the layers, where published runs differ from trident (whose kernels
// are the defaults): the step model reads these to meet each run at its own implementation.
struct StepModelOptions {
  // Full recomputation reruns the whole block (Megatron's --recompute-granularity full,
  // Composer's activation checkpointing), not only up to the MLP's output projection as
  // trident's does.
  bool whole_layer_recompute = false;
  // false: attention materializes its scores (Megatron-LM in 2021, before FlashAttention):
  // two batched GEMMs per head, and softmax and dropout over B H T^2 scores in HBM.
  bool flash_attention = true;
  // PyTorch eager (torchtitan without torch.compile): RMSNorm, the rotary embedding and
  // SwiGLU as separate kernels in fp32, about 3.4 times the fused kernels' bytes.
  bool eager_elementwise = false;
  // FSDP with fp32 parameters under autocast (Composer's DEFAULT mixed precision): every
  // forward casts the gathered weights to bf16, every backward the gradients to fp32.
  bool fp32_weight_casts = false;
};

// One block's times for one micro-batch on one tp rank, seconds.
struct LayerTimes {
  double gemm_forward = 0;     // the four projections
  double mlp_out_forward = 0;  // of which the MLP's output projection (trident's full recompute keeps its input)
  double gemm_input_grad = 0, gemm_weight_grad = 0;
  double attention_forward = 0, attention_backward = 0;
  double elementwise_forward = 0, elementwise_backward = 0;
  double forward() const { return gemm_forward + attention_forward + elementwise_forward; }
  double input_grad() const { return gemm_input_grad + attention_backward + elementwise_backward; }
};
// Sequence parallelism splits the norms' and residuals' rows over tp.
LayerTimes layer_times(const TransformerSpec& spec, int micro_batch, int tp, bool sequence_parallel, const GpuModel& gpu,
                       const StepModelOptions& options = {});

// The head (last stage): its GEMM and the cross-entropy over the logits (forward,
// input-gradient and weight-gradient passes).
PassTimes head_times(const TransformerSpec& spec, int micro_batch, int tp, const GpuModel& gpu);

}  // namespace trident
