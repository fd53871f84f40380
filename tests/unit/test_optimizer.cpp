// The optimizers (AdamW, Lion, Muon), clipping and the learning-rate schedule against their
// formulas (FORMAT.md's for AdamW, Moonlight's for Muon), computed here independently in
// double precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/kernels.h"
#include "model/transformer.h"
#include "optim/gradient_clip.h"
#include "optim/optimizer.h"
#include "optim/lr_schedule.h"
#include "kernels/base/error.h"
#include "tests/model_shapes.h"

namespace trident {
namespace {

ModelConfig tiny_model() { return gpt2_shape(1, 2, 8, 4, 11); }

TEST(AdamW, FollowsFormatMdForEveryTensor) {
  auto k = kernels::make_cpu_kernels();
  Transformer model(tiny_model(), *k);
  model.init_parameters(7);
  const ParameterLayout& layout = model.layout();
  const size_t n = layout.total_floats();
  const OptimizerSettings s{0.9, 0.95, 1e-8, 0.1};
  const std::unique_ptr<Optimizer> adamw = make_optimizer("adamw", layout, s, *k);
  Optimizer& opt = *adamw;

  std::vector<double> p(model.store().params(), model.store().params() + n), m(n, 0.0), v(n, 0.0);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const double lr = 3e-3, scale = 0.7;
  for (int t = 1; t <= 3; t++) {
    for (const auto& tensor : layout.tensors())
      for (size_t i = 0; i < tensor.numel(); i++) model.store().grads()[tensor.offset + i] = normal(rng);
    opt.step(model.store().params(), model.store().grads(), lr, scale);
    model.store().parameters_changed();
    for (const auto& tensor : layout.tensors()) {
      const double wd = tensor.shape.size() >= 2 ? s.weight_decay : 0.0;  // FORMAT.md: 2+ dims only
      for (size_t i = tensor.offset; i < tensor.offset + tensor.numel(); i++) {
        const double g = static_cast<double>(model.store().grads()[i]) * scale;
        p[i] *= 1 - lr * wd;
        m[i] = s.beta1 * m[i] + (1 - s.beta1) * g;
        v[i] = s.beta2 * v[i] + (1 - s.beta2) * g * g;
        const double mh = m[i] / (1 - std::pow(s.beta1, t)), vh = v[i] / (1 - std::pow(s.beta2, t));
        p[i] -= lr * mh / (std::sqrt(vh) + s.eps);
        ASSERT_NEAR(model.store().params()[i], p[i], 1e-6 + 1e-5 * std::abs(p[i])) << tensor.name << " step " << t;
      }
    }
  }
  EXPECT_EQ(opt.steps_taken(), 3);
  // Decay reaches matrices and embeddings only.
  EXPECT_TRUE(layout.tensor("wte.weight").placement.weight_decay);
  EXPECT_TRUE(layout.tensor("h.0.mlp.c_fc.weight").placement.weight_decay);
  EXPECT_FALSE(layout.tensor("h.0.mlp.c_fc.bias").placement.weight_decay);
  EXPECT_FALSE(layout.tensor("h.0.ln_1.weight").placement.weight_decay);
}

// Lion through the optimizer interface, over a model's layout and a ZeRO shard of it: one
// step against its formula in float64 (decay on the 2-D tensors only), its one state
// buffer, and every parameter moved by exactly lr.
TEST(Lion, OneStepFollowsItsFormulaInFloat64OnAShard) {
  auto k = kernels::make_cpu_kernels();
  Transformer model(tiny_model(), *k);
  model.init_parameters(7);
  const ParameterLayout& layout = model.layout();
  const size_t n = layout.total_floats();
  // A shard: the second half of the flat buffer (ZeRO's owned ranges), cutting a tensor.
  const std::vector<FlatRange> owned = {{n / 2, n}};
  const OptimizerSettings s{0.9, 0.99, 0.0, 0.3};
  const std::unique_ptr<Optimizer> lion = make_optimizer("lion", layout, s, *k, owned);
  EXPECT_EQ(lion->kind().state_names, std::vector<std::string>{"exp_avg"});
  // One float of state per parameter of the shard (not for the padding between tensors).
  size_t in_shard = 0, stored = 0;
  for (const ParameterTensor& t : layout.tensors()) {
    stored += t.stored;
    for (size_t i = t.offset; i < t.offset + t.stored; i++) in_shard += i >= n / 2;
  }
  ASSERT_LT(stored, n);  // there is padding to leave out
  EXPECT_EQ(lion->state_floats(), in_shard);
  // Momentum from an earlier step (through the checkpoint's path), and gradients.
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> momentum(n), before(model.store().params(), model.store().params() + n);
  for (float& m : momentum) m = 0.1f * normal(rng);
  lion->state_from_host(0, momentum.data());
  for (size_t i = 0; i < n; i++) model.store().grads()[i] = normal(rng);
  const double lr = 1e-3, scale = 0.8;
  lion->step(model.store().params(), model.store().grads(), lr, scale);
  std::vector<float> after_momentum(n);
  lion->state_to_host(0, after_momentum.data(), n);
  int moved = 0;
  for (const ParameterTensor& t : layout.tensors())
    for (size_t i = t.offset; i < t.offset + t.stored; i++) {
      const double p = before[i], m = momentum[i], g = static_cast<double>(model.store().grads()[i]) * scale;
      if (i < n / 2) {  // another rank's: untouched, no state here
        ASSERT_EQ(model.store().params()[i], before[i]) << t.name;
        ASSERT_EQ(after_momentum[i], 0.0f) << t.name;
        continue;
      }
      const double wd = t.shape.size() >= 2 ? s.weight_decay : 0.0, c = s.beta1 * m + (1 - s.beta1) * g;
      const double want = p * (1 - lr * wd) - lr * ((c > 0) - (c < 0));
      ASSERT_NEAR(model.store().params()[i], want, 1e-7 * (1 + std::abs(want))) << t.name << " " << i;
      ASSERT_NEAR(after_momentum[i], s.beta2 * m + (1 - s.beta2) * g, 1e-7) << t.name << " " << i;
      if (wd == 0) {
        ASSERT_NEAR(std::abs(model.store().params()[i] - p), lr, 1e-7) << t.name;  // exactly lr
      }
      moved++;
    }
  EXPECT_GT(moved, 0);
  EXPECT_EQ(lion->steps_taken(), 1);
  EXPECT_THROW(make_optimizer("sgd", layout, s, *k), UsageError);
}

// Muon's orthogonalization in float64, as Moonlight's zeropower_via_newtonschulz5 (the
// reference generator's newton_schulz): X = G / (|G| + 1e-7), transposed when tall, 5 steps.
std::vector<double> newton_schulz_in_double(const std::vector<double>& g, int64_t rows, int64_t columns) {
  const bool tall = rows > columns;
  const int64_t r = tall ? columns : rows, c = tall ? rows : columns;
  std::vector<double> x(r * c);
  double squares = 0;
  for (double v : g) squares += v * v;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < columns; j++) x[tall ? j * c + i : i * c + j] = g[i * columns + j] / (std::sqrt(squares) + 1e-7);
  for (int step = 0; step < 5; step++) {
    std::vector<double> a(r * r, 0.0), b(r * r, 0.0), next(r * c, 0.0);
    for (int64_t i = 0; i < r; i++)
      for (int64_t j = 0; j < r; j++)
        for (int64_t k = 0; k < c; k++) a[i * r + j] += x[i * c + k] * x[j * c + k];
    for (int64_t i = 0; i < r; i++)
      for (int64_t j = 0; j < r; j++) {
        double aa = 0;
        for (int64_t k = 0; k < r; k++) aa += a[i * r + k] * a[k * r + j];
        b[i * r + j] = -4.7750 * a[i * r + j] + 2.0315 * aa;
      }
    for (int64_t i = 0; i < r; i++)
      for (int64_t j = 0; j < c; j++) {
        double bx = 0;
        for (int64_t k = 0; k < r; k++) bx += b[i * r + k] * x[k * c + j];
        next[i * c + j] = 3.4445 * x[i * c + j] + bx;
      }
    x = next;
  }
  std::vector<double> out(rows * columns);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < columns; j++) out[i * columns + j] = x[tall ? j * c + i : i * c + j];
  return out;
}

// Muon on one rank: the hidden matrices (2-D, in a block) with Nesterov momentum and the
// whole matrix orthogonalized, scaled by 0.2 sqrt(max(rows, columns)); the rest AdamW.
// One step from a momentum left by an earlier one, against float64: the iteration on wide
// (c_proj of the MLP), tall (c_attn, c_fc) and square (the attention's c_proj) matrices.
TEST(Muon, OneStepFollowsMoonlightInFloat64) {
  auto k = kernels::make_cpu_kernels();
  Transformer model(tiny_model(), *k);
  model.init_parameters(7);
  const ParameterLayout& layout = model.layout();
  const size_t n = layout.total_floats();
  const OptimizerSettings s{0.9, 0.95, 1e-8, 0.1};
  const std::unique_ptr<Optimizer> muon = make_optimizer("muon", layout, s, *k);
  ASSERT_EQ(muon->kind().state_names, (std::vector<std::string>{"momentum_buffer", "exp_avg", "exp_avg_sq"}));
  const std::vector<std::string> matrices = {"h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight",
                                             "h.0.mlp.c_fc.weight", "h.0.mlp.c_proj.weight"};
  size_t matrix_floats = 0, other_floats = 0;
  for (const ParameterTensor& t : layout.tensors()) {
    const bool matrix = std::find(matrices.begin(), matrices.end(), t.name) != matrices.end();
    (matrix ? matrix_floats : other_floats) += t.stored;
  }
  // One float per matrix parameter, two for the rest (wte, wpe, norms, biases).
  EXPECT_EQ(muon->state_floats(), matrix_floats + 2 * other_floats);
  EXPECT_EQ(muon->kind().state_floats_for(layout, {}), muon->state_floats());

  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> momentum(n, 0.0f), before(model.store().params(), model.store().params() + n);
  for (const std::string& name : matrices) {
    const ParameterTensor& t = layout.tensor(name);
    for (size_t i = t.offset; i < t.offset + t.stored; i++) momentum[i] = 0.1f * normal(rng);
  }
  muon->state_from_host(0, momentum.data());
  for (size_t i = 0; i < n; i++) model.store().grads()[i] = normal(rng);
  const double lr = 3e-3, scale = 0.8, mu = 0.95;
  muon->step(model.store().params(), model.store().grads(), lr, scale);
  std::vector<float> after_momentum(n), exp_avg(n);
  muon->state_to_host(0, after_momentum.data(), n);
  muon->state_to_host(1, exp_avg.data(), n);
  for (const ParameterTensor& t : layout.tensors()) {
    const bool matrix = std::find(matrices.begin(), matrices.end(), t.name) != matrices.end();
    std::vector<double> u(t.stored), want(t.stored);
    for (size_t i = 0; i < t.stored; i++) {
      const size_t at = t.offset + i;
      const double g = static_cast<double>(model.store().grads()[at]) * scale;
      if (matrix) {
        const double buf = mu * momentum[at] + g;
        ASSERT_NEAR(after_momentum[at], buf, 1e-6) << t.name;
        ASSERT_EQ(exp_avg[at], 0.0f) << t.name << ": AdamW's state has no place for a matrix";
        u[i] = g + mu * buf;
      } else {  // AdamW's first step: m = (1 - b1) g, v = (1 - b2) g^2, bias-corrected
        ASSERT_EQ(after_momentum[at], 0.0f) << t.name;
        ASSERT_NEAR(exp_avg[at], (1 - s.beta1) * g, 1e-6) << t.name;
        const double wd = t.shape.size() >= 2 ? s.weight_decay : 0.0;
        want[i] = before[at] * (1 - lr * wd) - lr * g / (std::abs(g) + s.eps);
      }
    }
    if (matrix) {
      const std::vector<double> o = newton_schulz_in_double(u, t.shape[0], t.shape[1]);
      const double step = lr * 0.2 * std::sqrt(static_cast<double>(std::max(t.shape[0], t.shape[1])));
      for (size_t i = 0; i < t.stored; i++) want[i] = before[t.offset + i] * (1 - lr * s.weight_decay) - step * o[i];
    }
    for (size_t i = 0; i < t.stored; i++)
      ASSERT_NEAR(model.store().params()[t.offset + i], want[i], 1e-6 * (1 + std::abs(want[i]))) << t.name << " " << i;
  }
  EXPECT_EQ(muon->steps_taken(), 1);
}

TEST(ClipGradients, NormAndCoefficient) {
  auto k = kernels::make_cpu_kernels();
  std::vector<float> g(100000, 0.0f);
  double sum = 0;
  for (size_t i = 0; i < g.size(); i++) {
    g[i] = static_cast<float>(std::sin(0.001 * i));
    sum += static_cast<double>(g[i]) * g[i];
  }
  const GradientNorm clipped = clip_gradients(*k, g.data(), g.size(), 1.0);
  EXPECT_NEAR(clipped.norm, std::sqrt(sum), 1e-9 * std::sqrt(sum));
  EXPECT_NEAR(clipped.clip_coefficient, 1.0 / (std::sqrt(sum) + 1e-6), 1e-12);
  EXPECT_EQ(clip_gradients(*k, g.data(), g.size(), 1e9).clip_coefficient, 1.0);  // under the limit
  EXPECT_EQ(clip_gradients(*k, g.data(), g.size(), 0.0).clip_coefficient, 1.0);  // disabled
}

TEST(LearningRateSchedule, WarmupThenCosineToMin) {
  const LearningRateSchedule s{1e-3, 1e-4, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);     // (0+1)/10 of the peak
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);     // end of warmup
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);    // cosine starts at the peak
  // Halfway between steps 59 and 60 (progress 49/99 and 50/99, symmetric about 1/2): the
  // cosine terms cancel, so their mean is exactly the mean of peak and floor.
  EXPECT_NEAR(s.at(59), 1e-4 + 0.5 * 9e-4 * (1 + std::cos(M_PI * 49 / 99)), 1e-15);
  EXPECT_NEAR((s.at(59) + s.at(60)) / 2, 5.5e-4, 1e-15);
  EXPECT_DOUBLE_EQ(s.at(109), 1e-4);   // last step reaches min_lr
  for (int i = 10; i < 109; i++) EXPECT_GE(s.at(i), s.at(i + 1));
  EXPECT_DOUBLE_EQ(s.at(500), 1e-4);   // and keeps it after decay_steps (a run extended past its plan)
}

TEST(LearningRateSchedule, LinearConstantAndWarmupStableDecay) {
  LearningRateSchedule linear{1e-3, 1e-4, 10, 110, LrShape::linear};
  EXPECT_DOUBLE_EQ(linear.at(10), 1e-3);
  EXPECT_NEAR(linear.at(59), 1e-3 - 9e-4 * 49.0 / 99, 1e-15);
  EXPECT_DOUBLE_EQ(linear.at(109), 1e-4);
  EXPECT_DOUBLE_EQ(linear.at(200), 1e-4);
  const LearningRateSchedule constant{1e-3, 1e-4, 10, 110, LrShape::constant};
  EXPECT_DOUBLE_EQ(constant.at(4), 5e-4);  // warmup as the others
  EXPECT_DOUBLE_EQ(constant.at(109), 1e-3);
  EXPECT_DOUBLE_EQ(constant.at(1000), 1e-3);
  // WSD: the peak until the last 20 steps before 110, then linear to the floor.
  const LearningRateSchedule wsd{1e-3, 1e-4, 10, 110, LrShape::wsd, 20};
  EXPECT_DOUBLE_EQ(wsd.at(50), 1e-3);
  EXPECT_DOUBLE_EQ(wsd.at(89), 1e-3);
  EXPECT_DOUBLE_EQ(wsd.at(90), 1e-3);  // the decay's first step
  EXPECT_NEAR(wsd.at(99), 1e-3 - 9e-4 * 9.0 / 19, 1e-15);
  EXPECT_DOUBLE_EQ(wsd.at(109), 1e-4);
  for (int i = 10; i < 109; i++) EXPECT_GE(wsd.at(i), wsd.at(i + 1));
  EXPECT_EQ(wsd.describe(), "wsd: warmup 10 steps to 1.00e-03, stable to step 90, then linear down to 1.00e-04 at step 110");
  // A decay of one step: its step is the floor.
  const LearningRateSchedule one{1e-3, 1e-4, 10, 110, LrShape::wsd, 1};
  EXPECT_DOUBLE_EQ(one.at(108), 1e-3);
  EXPECT_DOUBLE_EQ(one.at(109), 1e-4);
  EXPECT_EQ(parse_choice<LrShape>("wsd"), LrShape::wsd);
  EXPECT_THROW(parse_choice<LrShape>("step"), UsageError);
}

}  // namespace
}  // namespace trident
