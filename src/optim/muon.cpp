// Muon (Keller Jordan 2024; "Muon is Scalable for LLM Training", Liu et al. 2025, as
// MoonshotAI/Moonlight's examples/toy_train.py does it) for the hidden matrices, AdamW
// (adamw.cpp's kernel, with train.beta1/beta2/adam_eps) for every other tensor:
//   buf = mu buf + g;  u = g + mu buf  (Nesterov momentum, mu = 0.95);
//   O = NewtonSchulz5(u) over the whole matrix (newton_schulz below);
//   p = p (1 - lr wd) - lr 0.2 sqrt(max(rows, columns)) O.
// O's entries have an RMS of about 1/sqrt(max(rows, columns)); the factor 0.2 sqrt(...)
// gives the update AdamW's typical RMS (about 0.2), so AdamW's lr and weight decay carry over.
//
// The hidden matrices: the tensors whose placement says so (Placement::hidden_matrix, as
// their layers declare them: model/layers/parallel_linear.cpp, moe.cpp), i.e. the attention
// and MLP projections and each expert's matrices (every tensor its own matrix: GPT-2's fused
// c_attn is one, as in Hugging Face's model). Not the token and position embeddings or
// the head (the model's ends, outside the blocks), norms and biases (1-D), nor a mixture's
// router, which every tp rank holds whole: its [experts x d] rows are the logits of a
// choice among a few experts, a classifier like the head, and equalizing its singular
// values would push every expert's logit as hard as the most used one's. (Moonlight's own
// rule, every 2-D tensor but the embedding and the head, would take a router too.)
//
// Distribution (as DistMuon and Dion do it): u is elementwise, so each rank computes it on
// the ranges it owns; the orthogonalization needs the matrix whole. Each matrix has an
// owner, round robin over the shard group and then over tp: the shard owner gathers this
// tp rank's piece from the owned ranges (all_to_all over the shard group), the tp owner
// gathers the pieces (over tp), assembles the matrix, orthogonalizes it and sends each
// piece back, and the shard owner each rank's ranges. The shard group is ZeRO's; without
// ZeRO it is the data-parallel ranks, which all own everything (the mesh's owned ranges
// alike): the owner takes u from itself and sends O to all of them. The same whole matrix
// goes into the same iteration on every layout: the update does not depend on the layout.
//
// State: momentum_buffer (the hidden matrices' only) and AdamW's exp_avg and exp_avg_sq
// (the other tensors' only); one float per parameter of a matrix, two for the rest.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "optim/optimizer.h"
#include "parallel/communicator.h"

namespace trident {

namespace {

constexpr float kMomentum = 0.95f;       // Moonlight's and Keller Jordan's
constexpr double kAdamWRmsMatch = 0.2;   // the update's RMS scale, times sqrt(max(rows, columns))
constexpr size_t kMomentumBuffer = 0, kExpAvg = 1, kExpAvgSq = 2;  // the state buffers

// The quintic Newton-Schulz iteration of Keller Jordan's Muon, as Moonlight's
// zeropower_via_newtonschulz5 runs it: it takes a matrix G to about U V^T of its SVD
// G = U S V^T (every singular value near 1, between about 0.7 and 1.2: the coefficients
// trade exactness for speed), in matrix products only:
//   X = G / (||G||_F + 1e-7), transposed when it has more rows than columns;
//   5 times: A = X X^T;  B = b A + c A A;  X = a X + B X;  then transposed back.
// fp32 on the host, in the CPU backend's sgemm (Moonlight runs it in bf16 on a GPU; a GPU
// path would be a kernel op, kernels/ops.def). g: rows x columns, row-major; the result has its shape.
constexpr int kNewtonSchulzSteps = 5;
constexpr float kNewtonSchulzA = 3.4445f, kNewtonSchulzB = -4.7750f, kNewtonSchulzC = 2.0315f;

std::vector<float> newton_schulz(const float* g, int64_t rows, int64_t columns) {
  // X is r x c with r <= c, so that X X^T is the smaller Gram matrix.
  const bool tall = rows > columns;
  const int64_t r = tall ? columns : rows, c = tall ? rows : columns;
  std::vector<float> x(static_cast<size_t>(r * c));
  double squares = 0.0;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < columns; j++) {
      const float v = g[i * columns + j];
      squares += static_cast<double>(v) * v;
      x[tall ? j * c + i : i * c + j] = v;
    }
  const float norm = static_cast<float>(std::sqrt(squares) + 1e-7);
  for (float& v : x) v /= norm;
  std::vector<float> a(static_cast<size_t>(r * r)), b(a.size()), next(x.size());
  const int R = static_cast<int>(r), C = static_cast<int>(c);
  for (int step = 0; step < kNewtonSchulzSteps; step++) {
    // A = X X^T; B = b A + c A A; X = a X + B X: the CPU backend's sgemm (the linear layers').
    kernels::cpu::gemm<float>(false, true, R, R, C, 1.0f, x.data(), C, x.data(), C, 0.0f, a.data(), R);
    for (size_t i = 0; i < a.size(); i++) b[i] = kNewtonSchulzB * a[i];
    kernels::cpu::gemm<float>(false, false, R, R, R, kNewtonSchulzC, a.data(), R, a.data(), R, 1.0f, b.data(), R);
    for (size_t i = 0; i < x.size(); i++) next[i] = kNewtonSchulzA * x[i];
    kernels::cpu::gemm<float>(false, false, R, C, R, 1.0f, b.data(), R, x.data(), C, 1.0f, next.data(), C);
    x.swap(next);
  }
  if (!tall) return x;
  std::vector<float> back(x.size());
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < columns; j++) back[i * columns + j] = x[j * c + i];
  return back;
}

// The tensors it updates whole (OptimizerKind::whole_tensor): as their placement declares.
bool whole(const Placement& p) { return p.hidden_matrix; }
bool hidden_matrix(const ParameterTensor& t) { return whole(t.placement); }

// send[p] to rank p of `group` and counts[p] floats from each rank p back, one block after
// the other in rank order. Null group: this rank alone (its block to itself).
std::vector<float> exchange(Communicator* group, const std::vector<std::vector<float>>& send,
                            const std::vector<size_t>& counts) {
  std::vector<float> out;
  std::vector<size_t> send_counts;
  for (const std::vector<float>& block : send) {
    out.insert(out.end(), block.begin(), block.end());
    send_counts.push_back(block.size());
  }
  if (group == nullptr) return out;
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::vector<float> in(total);
  group->all_to_all_v({reinterpret_cast<kernels::Act*>(out.data()), out.size(), kernels::DType::f32}, send_counts,
                      {reinterpret_cast<kernels::Act*>(in.data()), in.size(), kernels::DType::f32}, counts);
  return in;
}

class Muon final : public Optimizer {
 public:
  Muon(const OptimizerKind& kind, const ParameterLayout& layout, const OptimizerSettings& settings,
       kernels::Kernels& k, const std::vector<FlatRange>& owned, const OptimizerMesh& mesh);

  using Optimizer::step;
  void step(const ParameterAt& parameter_at, const GradientAt& gradient_at, double lr, double grad_scale) override;

 private:
  // A hidden matrix of this stage and where its parts are.
  struct Matrix {
    int tensor = 0;
    int shard_owner = 0, tp_owner = 0;  // who gathers this tp rank's piece; who gathers the pieces
    // Per shard rank: its parts of this tp rank's piece (in its owned ranges' order).
    std::vector<std::vector<FlatRange>> slices;
    std::vector<const Segment*> mine;  // this rank's segments of it: slices[shard_rank_]
    std::vector<float> piece;          // on the shard owner, during a step: u's piece, then O's
  };

  // AdamW, for the tensors that are not hidden matrices.
  void update(float* param, const float* grad, float* const* state, size_t n, double lr, double weight_decay, int t,
              double grad_scale) override {
    k_.adamw_update(param, grad, state[kExpAvg], state[kExpAvgSq], n, static_cast<float>(lr),
                    static_cast<float>(settings_.beta1), static_cast<float>(settings_.beta2),
                    static_cast<float>(settings_.eps), static_cast<float>(weight_decay), t,
                    static_cast<float>(grad_scale));
  }
  float* u_of(const Segment& s) { return updates_.data() + s.state_offset[kMomentumBuffer]; }
  // Over the shard group: each matrix's piece whole on its shard owner.
  void gather_pieces();
  // Over tp, on the shard owners: the pieces whole on the tp owner, orthogonalized there,
  // and each tp rank's piece back.
  void orthogonalize_pieces();
  // Over the shard group: each rank's parts of the orthogonalized pieces back (into updates_).
  void scatter_pieces();

  std::vector<Matrix> matrices_;
  std::vector<int> matrix_of_;   // per tensor of the layout: its index in matrices_, or -1
  std::vector<float> updates_;   // u, then O, where the momentum buffer holds the matrices
  int shard_rank_ = 0, shard_size_ = 1, tp_rank_ = 0, tp_size_ = 1;
  bool replicated_ = false;  // every shard rank owns all of this rank's ranges (no ZeRO)
};

Muon::Muon(const OptimizerKind& kind, const ParameterLayout& layout, const OptimizerSettings& settings,
           kernels::Kernels& k, const std::vector<FlatRange>& owned, const OptimizerMesh& mesh)
    : Optimizer(kind, layout, settings, k, owned, mesh) {
  require(k.host_memory(), "train.optimizer = muon runs on the CPU backend only (its Newton-Schulz iteration is "
                           "host code); on a GPU use adamw or lion");
  if (mesh.shards != nullptr) {
    shard_rank_ = mesh.shards->rank();
    shard_size_ = mesh.shards->size();
  }
  if (mesh.tp != nullptr) {
    tp_rank_ = mesh.tp->rank();
    tp_size_ = mesh.tp->size();
  }
  require(layout.ep_size() == 1 || shard_size_ == 1,
          "train.optimizer = muon under expert parallelism needs parallel.zero = 0 (ZeRO shards the experts over "
          "another group, which Muon does not gather over yet)");
  const std::vector<FlatRange> mine = owned.empty() ? std::vector<FlatRange>{{0, layout.total_floats()}} : owned;
  const std::vector<std::vector<FlatRange>> owned_by = mesh.shards != nullptr ? mesh.owned_by
                                                                              : std::vector<std::vector<FlatRange>>{mine};
  replicated_ = std::all_of(owned_by.begin(), owned_by.end(), [&](const std::vector<FlatRange>& ranges) {
    return std::equal(ranges.begin(), ranges.end(), mine.begin(), mine.end(),
                      [](const FlatRange& a, const FlatRange& b) { return a.begin == b.begin && a.end == b.end; });
  });
  check(owned_by.size() == static_cast<size_t>(shard_size_) && owned_by[shard_rank_].size() == mine.size(),
        "muon: the mesh's owned ranges are not the optimizer's");
  for (size_t i = 0; i < mine.size(); i++)
    check(owned_by[shard_rank_][i].begin == mine[i].begin && owned_by[shard_rank_][i].end == mine[i].end,
          "muon: the mesh's owned ranges are not the optimizer's");

  matrix_of_.assign(layout.tensors().size(), -1);
  double fingerprint = 0;  // the matrices' places, which every tp rank must share
  for (size_t index = 0; index < layout.tensors().size(); index++) {
    const ParameterTensor& t = layout.tensors()[index];
    if (!hidden_matrix(t)) continue;
    const int j = static_cast<int>(matrices_.size());
    Matrix m;
    m.tensor = static_cast<int>(index);
    m.shard_owner = j % shard_size_;
    m.tp_owner = (j / shard_size_) % tp_size_;
    for (const std::vector<FlatRange>& ranges : owned_by) {
      m.slices.emplace_back();
      for (const FlatRange& r : ranges) {
        const size_t begin = std::max(r.begin, t.offset), end = std::min(r.end, t.offset + t.stored);
        if (begin < end) m.slices.back().push_back({begin, end});
      }
    }
    matrix_of_[index] = j;
    matrices_.push_back(std::move(m));
    fingerprint += static_cast<double>(t.offset) * (j + 1) + static_cast<double>(t.stored);
  }
  for (const Segment& s : segments())
    if (matrix_of_[s.tensor] >= 0) matrices_[matrix_of_[s.tensor]].mine.push_back(&s);
  for (const Matrix& m : matrices_) {
    check(m.mine.size() == m.slices[shard_rank_].size(), "muon: a matrix's segments are not its slices");
    for (size_t i = 0; i < m.mine.size(); i++) check(m.mine[i]->offset == m.slices[shard_rank_][i].begin, "muon: a matrix's segments are not its slices");
  }
  if (mesh.tp != nullptr)
    check(mesh.tp->all_reduce(fingerprint, ReduceOp::max) == fingerprint &&
              mesh.tp->all_reduce(-fingerprint, ReduceOp::max) == -fingerprint,
          "muon: the tp ranks' layouts place the matrices differently");
  size_t floats = 0;
  for (const Segment& s : segments())
    if (matrix_of_[s.tensor] >= 0) floats += s.size;
  updates_.assign(floats, 0.0f);
}

void Muon::step(const ParameterAt& parameter_at, const GradientAt& gradient_at, double lr, double grad_scale) {
  const int t = advance_step();
  const float scale = static_cast<float>(grad_scale);
  for (const Segment& s : segments()) {
    const float* grad = gradient_at(s.offset);
    if (matrix_of_[s.tensor] < 0) {
      float* state[3] = {nullptr, state_of(kExpAvg, s), state_of(kExpAvgSq, s)};
      update(parameter_at(s.offset), grad, state, s.size, lr, s.decay ? settings_.weight_decay : 0.0, t, grad_scale);
      continue;
    }
    float* buf = state_of(kMomentumBuffer, s);
    float* u = u_of(s);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < s.size; i++) {
      const float g = grad[i] * scale;
      buf[i] = kMomentum * buf[i] + g;
      u[i] = g + kMomentum * buf[i];
    }
  }
  gather_pieces();
  orthogonalize_pieces();
  scatter_pieces();
  for (const Segment& s : segments()) {
    if (matrix_of_[s.tensor] < 0) continue;
    const ParameterTensor& tensor = layout_[s.tensor];
    const float decay = static_cast<float>(1.0 - lr * (s.decay ? settings_.weight_decay : 0.0));
    const float step = static_cast<float>(
        lr * kAdamWRmsMatch * std::sqrt(static_cast<double>(std::max(tensor.shape[0], tensor.shape[1]))));
    float* param = parameter_at(s.offset);
    const float* o = u_of(s);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < s.size; i++) param[i] = param[i] * decay - step * o[i];
  }
}

void Muon::gather_pieces() {
  if (replicated_) {  // the owner has it all
    for (Matrix& m : matrices_) {
      if (m.shard_owner != shard_rank_) continue;
      m.piece.assign(layout_[m.tensor].stored, 0.0f);
      for (const Segment* s : m.mine)
        std::copy_n(u_of(*s), s->size, m.piece.begin() + (s->offset - layout_[m.tensor].offset));
    }
    return;
  }
  std::vector<std::vector<float>> send(shard_size_);
  std::vector<size_t> counts(shard_size_, 0);
  for (Matrix& m : matrices_) {
    for (const Segment* s : m.mine) send[m.shard_owner].insert(send[m.shard_owner].end(), u_of(*s), u_of(*s) + s->size);
    if (m.shard_owner != shard_rank_) continue;
    m.piece.assign(layout_[m.tensor].stored, 0.0f);
    for (int q = 0; q < shard_size_; q++)
      for (const FlatRange& r : m.slices[q]) counts[q] += r.size();
  }
  const std::vector<float> received = exchange(mesh_.shards, send, counts);
  size_t at = 0;  // rank q's block: its parts of the matrices owned here, in order
  for (int q = 0; q < shard_size_; q++)
    for (Matrix& m : matrices_) {
      if (m.shard_owner != shard_rank_) continue;
      for (const FlatRange& r : m.slices[q]) {
        std::copy_n(received.begin() + at, r.size(), m.piece.begin() + (r.begin - layout_[m.tensor].offset));
        at += r.size();
      }
    }
}

void Muon::orthogonalize_pieces() {
  // Each distinct piece from its first holder (fewer key/value heads than tp ranks: several
  // ranks hold one).
  const auto holders = [this](const Matrix& m) { return tp_size_ / layout_[m.tensor].placement.pieces; };
  std::vector<std::vector<float>> send(tp_size_);
  std::vector<size_t> counts(tp_size_, 0);
  for (const Matrix& m : matrices_) {
    if (m.shard_owner != shard_rank_) continue;
    if (tp_rank_ % holders(m) == 0) send[m.tp_owner].insert(send[m.tp_owner].end(), m.piece.begin(), m.piece.end());
    if (m.tp_owner == tp_rank_)
      for (int q = 0; q < tp_size_; q += holders(m)) counts[q] += layout_[m.tensor].stored;
  }
  const std::vector<float> received = exchange(mesh_.tp, send, counts);
  std::vector<std::vector<float>> pieces(matrices_.size());  // of the matrices orthogonalized here
  size_t at = 0;
  for (int q = 0; q < tp_size_; q++)
    for (size_t j = 0; j < matrices_.size(); j++) {
      const Matrix& m = matrices_[j];
      if (m.shard_owner != shard_rank_ || m.tp_owner != tp_rank_ || q % holders(m) != 0) continue;
      const size_t stored = layout_[m.tensor].stored;
      pieces[j].resize(stored * layout_[m.tensor].placement.pieces);
      std::copy_n(received.begin() + at, stored, pieces[j].begin() + (q / holders(m)) * stored);
      at += stored;
    }
  std::vector<std::vector<float>> back(tp_size_);
  std::vector<size_t> back_counts(tp_size_, 0);
  for (size_t j = 0; j < matrices_.size(); j++) {
    const Matrix& m = matrices_[j];
    if (m.shard_owner != shard_rank_) continue;
    const ParameterTensor& t = layout_[m.tensor];
    back_counts[m.tp_owner] += t.stored;
    if (m.tp_owner != tp_rank_) continue;
    const std::vector<float> whole = newton_schulz(layout_.assemble(t, pieces[j]).data(), t.shape[0], t.shape[1]);
    for (int q = 0; q < tp_size_; q++) {
      ParameterTensor holder = t;  // tp rank q's piece
      holder.placement.piece = q / holders(m);
      const std::vector<float> piece = layout_.shard_of(holder, whole.data());
      back[q].insert(back[q].end(), piece.begin(), piece.end());
    }
  }
  const std::vector<float> orthogonal = exchange(mesh_.tp, back, back_counts);
  at = 0;
  for (int q = 0; q < tp_size_; q++)
    for (Matrix& m : matrices_) {
      if (m.shard_owner != shard_rank_ || m.tp_owner != q) continue;
      std::copy_n(orthogonal.begin() + at, m.piece.size(), m.piece.begin());
      at += m.piece.size();
    }
}

void Muon::scatter_pieces() {
  std::vector<std::vector<float>> send(shard_size_);
  std::vector<size_t> counts(shard_size_, 0);
  for (Matrix& m : matrices_) {
    for (const Segment* s : m.mine) counts[m.shard_owner] += s->size;
    if (m.shard_owner != shard_rank_) continue;
    for (int q = 0; q < shard_size_; q++)
      for (const FlatRange& r : m.slices[q]) {
        const auto from = m.piece.begin() + (r.begin - layout_[m.tensor].offset);
        send[q].insert(send[q].end(), from, from + r.size());
      }
    std::vector<float>().swap(m.piece);
  }
  const std::vector<float> received = exchange(mesh_.shards, send, counts);
  size_t at = 0;  // the shard owner p's block: this rank's parts of its matrices, in order
  for (int p = 0; p < shard_size_; p++)
    for (const Matrix& m : matrices_) {
      if (m.shard_owner != p) continue;
      for (const Segment* s : m.mine) {
        std::copy_n(received.begin() + at, s->size, u_of(*s));
        at += s->size;
      }
    }
}

// u of the owned parts of the matrices (kept), and during a step its copies in the
// all-to-alls' buffers and the pieces gathered (round robin gives each rank about its share
// of the matrices): 6 floats per owned matrix float at the most; the iteration's
// temporaries of the largest matrix (its pieces, the matrix, X, X's next value, the result): 5.
size_t work_floats(const ParameterLayout& layout, const std::vector<FlatRange>& owned) {
  const std::vector<FlatRange> ranges = owned.empty() ? std::vector<FlatRange>{{0, layout.total_floats()}} : owned;
  size_t floats = 0, largest = 0;
  for (const ParameterTensor& t : layout.tensors()) {
    if (!hidden_matrix(t)) continue;
    largest = std::max(largest, t.numel());
    for (const FlatRange& r : ranges) {
      const size_t begin = std::max(r.begin, t.offset), end = std::min(r.end, t.offset + t.stored);
      if (begin < end) floats += end - begin;
    }
  }
  return 6 * floats + 5 * largest;
}

// An update reads p, g and the momentum (12 bytes), writes p, the momentum and u (12) and the
// bf16 copy (2), and reads u's orthogonalized form back (4); AdamW's tensors (30) are few.
const bool registered = register_optimizer(
    {"muon", {"momentum_buffer", "exp_avg", "exp_avg_sq"}, 30.0, make_as<Muon>,
     [](size_t state, const ParameterLayout& /*layout*/, const ParameterTensor& t) {
       return (state == kMomentumBuffer) == hidden_matrix(t);
     },
     work_floats, whole});

}  // namespace

}  // namespace trident
