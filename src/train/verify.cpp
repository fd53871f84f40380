#include "train/verify.h"

#include <algorithm>
#include <cmath>

#include "ckpt/hdf5_file.h"
#include "model/context_parallel.h"
#include "model/transformer_spec.h"
#include "kernels/base/error.h"
#include "runtime/injected_faults.h"
#include "train/setup.h"

namespace trident {

namespace {

template <typename A, typename B>
double relative_error(const A& ours, const B& reference) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ours.size(); i++) {
    const double d = static_cast<double>(ours[i]) - static_cast<double>(reference[i]);
    diff += d * d;
    norm += static_cast<double>(reference[i]) * reference[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The error slot of a tensor that this pipeline stage does not hold.
constexpr double kNotHere = -1.0;

// max that keeps a NaN from either side, so a NaN anywhere fails the check.
double nan_max(double a, double b) { return std::isnan(b) || b > a ? b : a; }

// The reference's routing of every step ([steps, layers, batch, seq_len, K] experts and
// [steps, layers, batch, seq_len] margins), and this rank's part of the comparison.
struct ReferenceRouting {
  std::vector<int32_t> chosen;
  std::vector<double> margin;
  int layers = 0, batch = 0, T = 0, K = 0;
  double choices = 0, differing = 0, differing_margin = INFINITY, margin_min = INFINITY;

  // The record of one step's forwards: a layer's k-th forward is micro-batch k of this
  // rank's slice (the sequences from `first_sequence`), its rows each sequence's
  // `positions`.
  void compare(int step, const RoutingRecord& record, int first_sequence, int micro_batch,
               const std::vector<int32_t>& positions) {
    std::vector<int> forwards_of_layer(layers, 0);
    const size_t T_local = positions.size();
    for (const RoutingRecord::Forward& f : record.forwards) {
      const int k = forwards_of_layer.at(f.layer)++;
      const size_t rows = f.experts.size() / K;
      for (size_t row = 0; row < rows; row++) {
        const size_t sequence = first_sequence + static_cast<size_t>(k) * micro_batch + row / T_local;
        const size_t token = ((static_cast<size_t>(step) * layers + f.layer) * batch + sequence) * T + positions[row % T_local];
        const int32_t* theirs = chosen.data() + token * K;
        const double m = margin.at(token);
        margin_min = std::min(margin_min, m);
        for (int j = 0; j < K; j++) {
          choices++;
          if (std::find(theirs, theirs + K, f.experts[row * K + j]) == theirs + K) {
            differing++;
            differing_margin = std::min(differing_margin, m);
          }
        }
      }
    }
  }
};

}  // namespace

Reference load_reference(const std::string& path) {
  Hdf5Reader file(path);
  const std::string format = file.attr_string("format");
  require(format == "trident-reference-v1",
          path + ": format is '" + format + "', expected 'trident-reference-v1'");
  Reference ref;
  ref.path = path;
  // The model's fields, each the attribute of its key where the file has it (the five
  // shapes always), through ModelConfig's one visitor; the family is the attribute
  // "model", GPT-2's references name their epsilon layernorm_eps.
  ref.model.family = file.attr_string("model");  // a family we know: transformer_spec below
  for (const char* shape : {"n_layer", "n_head", "d_model", "seq_len", "vocab_size"}) file.attr_int(shape);
  visit_model_fields(ref.model, [&file](const char* key, auto& field, const char*) {
    using T = std::decay_t<decltype(field)>;
    const std::string name = std::string(key) == "norm_eps" && !file.has_attr(key) ? "layernorm_eps" : key;
    if (!file.has_attr(name)) return;
    if constexpr (std::is_integral_v<T>) field = static_cast<T>(file.attr_int(name));
    else if constexpr (std::is_floating_point_v<T>) field = file.attr_double(name);
    else if constexpr (std::is_same_v<T, std::string>) field = file.attr_string(name);  // moe_router_score
  });
  // Packed documents, each attending within itself (tests/reference/README.md).
  if (file.has_attr("eod_token")) ref.eod_token = static_cast<int32_t>(file.attr_int("eod_token"));
  try {
    transformer_spec(ref.model);  // shapes the family can have
  } catch (const UsageError& e) {
    throw UsageError(path + ": " + e.what());
  }
  ref.batch = static_cast<int>(file.attr_int("batch_size"));
  ref.steps = static_cast<int>(file.attr_int("steps"));
  ref.lr = file.attr_double("lr");
  ref.beta1 = file.attr_double("beta1");
  ref.beta2 = file.attr_double("beta2");
  ref.adam_eps = file.attr_double("adam_eps");
  ref.weight_decay = file.attr_double("weight_decay");
  ref.grad_clip = file.attr_double("grad_clip");
  if (file.has_attr("optimizer")) ref.optimizer = file.attr_string("optimizer");  // Muon's references
  const auto shape = file.shape("batches/tokens");
  const std::vector<int64_t> expected = {ref.steps, ref.batch, ref.model.seq_len + 1};
  require(shape == expected, path + ": batches/tokens has the wrong shape");
  ref.tokens = file.read_int32("batches/tokens");
  return ref;
}

double VerifyReport::max_gradient_error() const {
  double m = 0;
  for (const auto& t : tensors) m = nan_max(m, t.gradient);
  return m;
}

double VerifyReport::max_final_param_error() const {
  double m = 0;
  for (const auto& t : tensors)
    if (!held_to_key_bias_tolerance(t)) m = nan_max(m, t.final_param);
  return m;
}

double VerifyReport::max_key_bias_param_error() const {
  double m = -1;
  for (const auto& t : tensors)
    if (held_to_key_bias_tolerance(t)) m = nan_max(std::max(m, 0.0), t.final_param);
  return m;
}

bool VerifyReport::held_to_key_bias_tolerance(const TensorError& t) const {
  return tolerance.key_bias_param != tolerance.param && is_key_bias(t.name);
}

bool VerifyReport::is_key_bias(const std::string& tensor) {
  for (const std::string suffix : {".attn.c_attn.bias", ".self_attn.k_proj.bias"})
    if (tensor.size() >= suffix.size() && tensor.compare(tensor.size() - suffix.size(), suffix.size(), suffix) == 0)
      return true;
  return false;
}

std::vector<std::string> VerifyReport::not_compared() const {
  std::vector<std::string> names;
  for (const auto& t : tensors)
    if (!t.compared) names.push_back(t.name);
  return names;
}

bool VerifyReport::passed() const {
  // Written so that a NaN anywhere fails; a tensor that no rank compared fails too. A
  // routing that differs from the reference's fails in fp32; in bf16 it leaves the
  // gradients, final parameters and dropped pairs unheld (gradients_unheld()).
  const bool gradients_held = gradients_unheld() ||
      (max_grad_norm_error <= tolerance.gradient && max_gradient_error() <= tolerance.gradient &&
       std::all_of(tensors.begin(), tensors.end(), [](const TensorError& t) { return t.final_param <= t.param_tolerance; }));
  return not_compared().empty() && loss_error <= tolerance.loss && max_step_loss_error <= tolerance.loss &&
         max_aux_loss_error <= tolerance.loss && (tokens_dropped_differing <= 0 || gradients_unheld()) &&
         (max_buffer_error <= kBufferTolerance || gradients_unheld()) &&
         routing_held() && gradients_held && !tensors.empty();
}

VerifyReport::Tolerances VerifyReport::tolerances_for(kernels::Precision precision) {
  if (precision == kernels::Precision::bf16)
    return {kBf16LossTolerance, kBf16GradientTolerance, kBf16ParamTolerance, kBf16KeyBiasParamTolerance, true};
  return {kLossTolerance, kGradientTolerance, kParamTolerance, kParamTolerance, false};
}

VerifyReport verify_against_reference(const Reference& ref, int micro_batch, kernels::Kernels& k,
                                      ParallelState& parallel, const ParallelConfig& settings,
                                      Recompute recompute, int recompute_layers, RecomputeMethod method) {
  const int dp = parallel.size(Axis::dp), dp_rank = parallel.coord(Axis::dp);
  require(ref.batch % dp == 0, "the reference batch (" + std::to_string(ref.batch) +
                                   ") must be a multiple of dp (" + std::to_string(dp) + ")");
  const int local_batch = ref.batch / dp;
  if (micro_batch == 0) micro_batch = local_batch;
  require(local_batch % micro_batch == 0, "train.micro_batch (" + std::to_string(micro_batch) +
                                              ") must divide the per-rank batch " + std::to_string(local_batch));
  Hdf5Reader file(ref.path);
  // The reference's model, batch and optimizer settings under the given layout.
  Config config;
  config.model = ref.model;
  config.parallel = settings;
  config.train.global_batch = ref.batch;
  config.train.micro_batch = micro_batch;
  config.train.recompute = recompute;
  config.train.recompute_layers = recompute_layers;
  config.train.recompute_method = method;
  config.train.beta1 = ref.beta1;
  config.train.beta2 = ref.beta2;
  config.train.adam_eps = ref.adam_eps;
  config.train.weight_decay = ref.weight_decay;
  config.train.optimizer = ref.optimizer;
  config.data.document_mask = ref.eod_token >= 0;
  config.data.eod_token = ref.eod_token;
  TrainingSetup setup(config, parallel, k);
  Transformer& model = setup.model;
  for (const ParameterTensor& t : model.layout().tensors()) {
    const std::string name = "params/" + t.name;
    require(file.shape(name) == t.shape, ref.path + ": " + name + " has the wrong shape");
    const std::vector<float> values = file.read_float(name);
    model.set_parameter(t.name, values.data(), values.size());
  }
  DataParallel& data_parallel = setup.data_parallel;
  StepRunner& runner = setup.runner;
  const std::vector<double> step_losses = file.read_double("steps/loss");
  const std::vector<double> grad_norms = file.read_double("steps/grad_norm");
  // A mixture of experts' auxiliary losses (load balance, z-loss), every step.
  const std::vector<double> aux_losses = file.has("steps/aux_loss") ? file.read_double("steps/aux_loss")
                                                                    : std::vector<double>{};
  // A capacity factor's drops, every step: the same pairs, so the same count.
  const std::vector<double> dropped = file.has("steps/tokens_dropped") ? file.read_double("steps/tokens_dropped")
                                                                       : std::vector<double>{};
  // The expert bias after each step, [steps, layers, E] (loss-free balancing).
  const std::vector<double> expert_bias = file.has("steps/expert_bias") ? file.read_double("steps/expert_bias")
                                                                        : std::vector<double>{};

  VerifyReport report;
  report.tolerance = VerifyReport::tolerances_for(k.precision());
  if (!expert_bias.empty()) report.max_buffer_error = 0;
  const int T = ref.model.seq_len;
  // The routing: counted on the first rank of each tensor-parallel group (its peers route
  // the same rows), each rank's own sequences and positions.
  ReferenceRouting routing;
  RoutingRecord record;
  const bool routing_here = file.has("steps/router_chosen");
  if (routing_here) {
    routing.chosen = file.read_int32("steps/router_chosen");
    routing.margin = file.read_double("steps/router_gap");
    routing.layers = ref.model.n_layer;
    routing.batch = ref.batch;
    routing.T = T;
    routing.K = static_cast<int>(routing.chosen.size() / routing.margin.size());
    model.record_routing(&record);
  }
  const std::vector<int32_t> positions = context_positions(T, parallel.size(Axis::cp), parallel.coord(Axis::cp));
  std::vector<int32_t> inputs(static_cast<size_t>(local_batch) * T), targets(inputs.size());
  for (int step = 0; step < ref.steps; step++) {
    parallel.set_step(step);
    for (int b = 0; b < local_batch; b++) {
      const size_t sequence = static_cast<size_t>(step) * ref.batch + dp_rank * local_batch + b;
      const int32_t* row = ref.tokens.data() + sequence * (T + 1);
      std::copy(row, row + T, inputs.begin() + static_cast<size_t>(b) * T);
      std::copy(row + 1, row + T + 1, targets.begin() + static_cast<size_t>(b) * T);
    }
    record.forwards.clear();
    const double loss = runner.compute_gradients(inputs.data(), targets.data(), local_batch, ref.batch);
    if (routing_here && parallel.coord(Axis::tp) == 0)
      routing.compare(step, record, dp_rank * local_batch, micro_batch, positions);
    if (step == 0) {
      const std::vector<float> gradients = data_parallel.gathered_gradients();  // ZeRO holds a shard
      report.loss = loss;
      report.loss_reference = file.read_double("step0/loss").at(0);
      report.loss_error = std::abs(loss - report.loss_reference) / std::abs(report.loss_reference);
      const ParameterLayout whole_model(ref.model);
      for (const ParameterTensor& t : whole_model.tensors()) {  // in order, including other stages' tensors
        const bool here = model.layout().has(t.name) && !injected_faults::verify_drops(parallel.rank(), t.name);
        report.tensors.push_back({t.name, here ? relative_error(model.tensor_from_host(t.name, gradients.data()),
                                                                file.read_double("step0/grads/" + t.name))
                                               : kNotHere, here ? 0.0 : kNotHere, true,
                                  VerifyReport::is_key_bias(t.name) ? report.tolerance.key_bias_param
                                                                    : report.tolerance.param});
      }
      // A tensor of the reference that the model has no place for (a family's own part
      // lost) is compared by no rank either.
      for (const std::string& name : file.members("final/params"))
        if (!whole_model.has(name))
          report.tensors.push_back({name, kNotHere, kNotHere, true, report.tolerance.param});
    }
    const GradientNorm norm = runner.update(ref.lr, ref.grad_clip);
    report.max_step_loss_error = nan_max(report.max_step_loss_error,
                                         std::abs(loss - step_losses[step]) / std::abs(step_losses[step]));
    if (!aux_losses.empty())
      report.max_aux_loss_error =
          nan_max(std::max(report.max_aux_loss_error, 0.0),
                  std::abs(runner.routing().aux_loss() - aux_losses[step]) / std::max(std::abs(aux_losses[step]), 1e-30));
    if (!dropped.empty()) {
      report.tokens_dropped += runner.routing().tokens_dropped();
      report.tokens_dropped_differing =
          std::max(report.tokens_dropped_differing, 0.0) + std::abs(runner.routing().tokens_dropped() - dropped[step]);
    }
    report.max_grad_norm_error = nan_max(report.max_grad_norm_error,
                                         std::abs(norm.norm - grad_norms[step]) / grad_norms[step]);
    if (!expert_bias.empty()) {  // this stage's layers' biases ("model.layers.<i>. ... .e_score_correction_bias")
      const ParameterLayout& layout = model.layout();
      std::vector<float> values(layout.buffer_floats());
      model.buffers_to_host(values.data());
      const size_t E = static_cast<size_t>(transformer_spec(ref.model).n_experts);
      for (const ParameterTensor& b : layout.buffers()) {
        const size_t layer = std::stoul(b.name.substr(std::string("model.layers.").size()));
        const double* expected = expert_bias.data() + (static_cast<size_t>(step) * ref.model.n_layer + layer) * E;
        for (size_t e = 0; e < E; e++)
          report.max_buffer_error = nan_max(report.max_buffer_error, std::abs(values[b.offset + e] - expected[e]));
      }
    }
  }
  if (!expert_bias.empty()) report.max_buffer_error = parallel.world().all_reduce(
      std::isnan(report.max_buffer_error) ? INFINITY : report.max_buffer_error, ReduceOp::max);
  if (routing_here) {
    model.record_routing(nullptr);
    std::vector<double> counts = {routing.choices, routing.differing};
    parallel.world().all_reduce(std::span<double>(counts));
    std::vector<double> closest = {-routing.differing_margin, -routing.margin_min};  // the least, as a max
    parallel.world().all_reduce(std::span<double>(closest), ReduceOp::max);
    report.routing_choices = counts[0];
    report.routing_differing = counts[1];
    report.routing_differing_margin = -closest[0];
    report.routing_margin = -closest[1];
  }
  for (TensorError& e : report.tensors)
    if (e.final_param != kNotHere)
      e.final_param = relative_error(model.full_parameter(e.name), file.read_double("final/params/" + e.name));
  // Each stage measured the tensors it holds: the largest error of each over the world
  // (a NaN is turned into +inf first, so that it survives the max). A slot that every
  // rank left at kNotHere was compared by none: a layout that lost a tensor everywhere.
  std::vector<double> errors;
  for (const TensorError& e : report.tensors)
    for (double v : {e.gradient, e.final_param}) errors.push_back(std::isnan(v) ? INFINITY : v);
  parallel.world().all_reduce(std::span<double>(errors), ReduceOp::max);
  for (size_t i = 0; i < report.tensors.size(); i++) {
    TensorError& e = report.tensors[i];
    e.gradient = errors[2 * i];
    e.final_param = errors[2 * i + 1];
    e.compared = e.gradient != kNotHere && e.final_param != kNotHere;
  }
  return report;
}

}  // namespace trident
