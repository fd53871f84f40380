#include "kernels/footprint.h"

#include "kernels/cuda/cuda_sizes.h"

namespace trident::kernels {

namespace {

class CudaFootprint final : public Footprint {
 public:
  explicit CudaFootprint(Precision precision) : precision_(precision) {}
  Precision precision() const override { return precision_; }
  DType activation_type() const override { return precision_ == Precision::bf16 ? DType::bf16 : DType::f32; }
  size_t attention_stats_floats(int B, int T, int NH) const override {
    return cuda_sizes::attention_stats_floats(B, T, NH);
  }
  size_t workspace_bytes(int N, int C, int max_width, int B, int T, int NH) const override {
    return cuda_sizes::workspace_bytes(N, C, max_width, B, T, NH);
  }

 private:
  Precision precision_;
};

}  // namespace

std::unique_ptr<Footprint> cuda_footprint(Precision precision) { return std::make_unique<CudaFootprint>(precision); }

}  // namespace trident::kernels
