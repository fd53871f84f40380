// The activations one pipeline stage keeps between a micro-batch's forward and backward
// passes, and the backward's scratch: each layer declares its buffers
// (model/layers/layer.h), and the arena lays them all out in one allocation, once. The
// memory plan (plan/memory_plan.h) measures the same declarations without allocating
// them, so what it prints is what the run holds.
//
// Recomputation trades compute for memory (Megatron's --recompute-granularity), by what
// each buffer's Retention says:
//   none       every layer keeps all it produced.
//   selective  attention's core is recomputed in backward (Megatron's selective
//              recompute): its statistics (each row's log-sum-exp) and its output are not
//              kept per layer; one attention forward per layer in backward.
//   full       each block keeps only its output (the next block's input); backward
//              reruns the block's forward up to its last output projection first.
//              With recompute_layers N > 0 (Megatron's --recompute-num-layers) only N
//              blocks of each model chunk do; the others keep all they produced. Which
//              N: method block, the chunk's first N (Megatron's); uniform, N spread
//              evenly over the chunk. Megatron's uniform instead reruns every layer in
//              groups of N, keeping each group's input only; trident's full already keeps
//              every block's input (its uniform at N = 1), and a group would need N
//              blocks' recomputed buffers at once (and ZeRO-3 N blocks gathered), more
//              than the N - 1 inputs it saves: so here uniform places the N recomputed
//              blocks, with the memory and time of block (docs/memory.md).
// A buffer that is not kept lives in one shared "recompute" set, reused by every block:
// the same place in each block (its recompute group) shares one buffer.
// Under sequence parallelism (Megatron's) the residual stream, the norms' outputs and
// their statistics hold this rank's B*T/tp rows only; what the column- and row-parallel
// GEMMs read and write holds all rows (split by width).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/choices.h"
#include "kernels/device_buffer.h"
#include "kernels/footprint.h"
#include "kernels/kernels.h"

namespace trident {

// The sizes of one stage's activations on one rank.
struct ActivationShape {
  int micro_batch = 1;
  int seq_len = 1;           // this rank's tokens of a sequence (model.seq_len / cp)
  int context_parallel = 1;  // cp: attention's ring buffers when above 1 (model/context_parallel.h)
  // Sequence parallelism: the residual stream and the norms' outputs hold 1/tp of the
  // B*T rows (this rank's), the rest all of them; 1 without.
  int sequence_shards = 1;
  // Micro-batches whose activations are alive at once (the pipeline's), each in a slot;
  // with several model chunks (interleaved) (micro-batch, chunk) pairs, each slot holding
  // one chunk's blocks (pipeline/schedule.h: ActivationSlots).
  int slots = 1;
  // Several chunks: per chunk, the slots of its own buffers (the embedding's, the final
  // norm's and the head's: what only one chunk declares), kept apart from the shared
  // slots; empty: `slots` each.
  std::vector<int> chunk_slots;
  Recompute recompute = Recompute::none;
  int recompute_layers = 0;  // full: the blocks of each chunk recomputed (0: all), as above
  RecomputeMethod recompute_method = RecomputeMethod::block;
  // zb1 (pipeline/schedule.h): the weight-gradient half of backward runs later, from what
  // the input-gradient half leaves in the slot (model/transformer.h); only without recompute.
  bool deferred_weight_gradients = false;
  bool sends_gradients = false;  // a pipeline stage past the first: its input's gradient goes upstream
  kernels::DType act_type = kernels::DType::f32;
  const kernels::Footprint* footprint = nullptr;  // the backend's sizes (attention's row statistics)

  size_t tokens() const { return static_cast<size_t>(micro_batch) * seq_len; }  // B*T
  size_t rows() const { return tokens() / sequence_shards; }  // of the residual stream here
  size_t act_bytes(size_t elements) const { return elements * kernels::dtype_bytes(act_type); }
  // Whether the recompute mode applies to block i (from 0) of a model chunk of n blocks:
  // always, but under full recomputation of some blocks (recompute_layers) to N of them.
  bool recomputes_block(int i, int n) const { return recomputes_block(recompute, recompute_layers, recompute_method, i, n); }
  static bool recomputes_block(Recompute mode, int layers, RecomputeMethod method, int i, int n);
};

enum class Element { act, f32, i32 };  // the backend's activation type, fp32 (statistics), int32

// Which recomputation drops a kept buffer (then recomputed into the shared set).
enum class Retention {
  always,                // kept under every mode (a block's output, the embedding's, the head's)
  dropped_by_full,       // rerun under full recomputation (a block's inner buffers)
  dropped_by_selective,  // and under selective (attention's core)
};

// The arena's bytes by part.
struct ActivationBytes {
  size_t per_slot = 0;   // one slot's kept activations (one micro-batch's; of one chunk's blocks under several)
  size_t chunk_own = 0;  // several chunks: the embedding's, final norm's and head's, all their slots
  size_t slots = 0;      // all kept: per_slot * shape.slots + chunk_own
  size_t recompute = 0;  // the shared set that recomputation refills
  size_t backward = 0;   // backward's scratch
  size_t total() const { return slots + recompute + backward; }
};

// What the layers of a stage declare, in order, for the arena to lay out.
class ActivationDeclarations {
 public:
  explicit ActivationDeclarations(const ActivationShape& shape) : shape_(shape) {}
  const ActivationShape& shape() const { return shape_; }

  // The buffers declared next that recomputation drops share the shared set with those
  // of every other declarer of the same group, place by place in the order declared (a
  // block sets group 0: each block's n-th such buffer shares one). -1 (the default, the
  // layers outside blocks): every buffer is kept.
  void set_recompute_group(int group);
  // The buffers declared next are all kept whatever the mode says (a block that partial
  // recomputation leaves whole), until set false.
  void set_kept_whole(bool whole) { kept_whole_ = whole; }
  // The buffers declared next are model chunk `chunk`'s: its blocks' (and its input), in
  // the slots the chunks share, or (own) the embedding's or head's, in the chunk's own.
  void set_chunk(int chunk, bool own = false);
  // A buffer kept from forward to backward, one per micro-batch slot; the handle finds
  // it (ActivationArena::kept).
  int keep(size_t elements, Element type, Retention retention = Retention::always);
  // Backward's scratch, shared by every layer and slot: one buffer per name, as large as
  // its largest request; *where gets its address when the arena is allocated.
  template <class T>
  void scratch(T*& where, const std::string& name, size_t elements, Element type) {
    add_scratch(reinterpret_cast<void**>(&where), name, elements, type);
  }
  // A GEMM of the stage, at its largest: rows x in -> rows x out (the kernels' workspace is
  // sized by the widest output, and by the largest operands where a backend copies them).
  void gemm(size_t rows, size_t in, size_t out) {
    widest_output_ = std::max(widest_output_, static_cast<int>(out));
    operands_.a = std::max(operands_.a, rows * std::max(in, out));  // x, or the output's gradient
    operands_.b = std::max(operands_.b, in * std::max(out, rows));  // the weight, or x (weight gradient)
  }
  int widest_output() const { return widest_output_; }
  const kernels::GemmOperands& gemm_operands() const { return operands_; }

 private:
  friend class ActivationArena;
  struct Kept {
    size_t bytes;
    Retention retention;
    int group, place;  // dropped: the shared buffer (group, place) holds it
    int chunk;
    bool own;          // in its chunk's own slots (several chunks)
  };
  struct Scratch {
    std::string name;
    size_t bytes;
    std::vector<void**> where;
  };
  void add_scratch(void** where, const std::string& name, size_t elements, Element type);
  size_t bytes_of(size_t elements, Element type) const;

  ActivationShape shape_;
  int group_ = -1;
  bool kept_whole_ = false;
  int chunk_ = 0;
  bool own_ = false;
  std::vector<int> dropped_in_group_;  // per group: its dropped buffers so far
  std::vector<Kept> kept_;
  std::vector<Scratch> scratch_;
  int widest_output_ = 0;
  kernels::GemmOperands operands_;
};

class ActivationArena {
 public:
  ActivationArena() = default;
  // Allocates what was declared, in one buffer of k's memory (every page touched once,
  // at start), and gives each scratch buffer's address to whoever asked for it.
  ActivationArena(ActivationDeclarations& declared, kernels::Kernels& k);
  // What the arena of these declarations takes, without allocating it.
  static ActivationBytes measure(const ActivationDeclarations& declared);

  const ActivationShape& shape() const { return shape_; }
  const ActivationBytes& bytes() const { return bytes_; }
  int slots() const { return shape_.slots; }
  int chunk_slots(int chunk) const { return chunk_slots_[chunk]; }  // its own buffers' slots
  // Several chunks: the micro-batch in `slot`, of chunk `chunk`, keeps that chunk's own
  // buffers in its slot `chunk_slot` (until the slot is bound again); by default slot `slot`.
  void bind(int slot, int chunk, int chunk_slot);
  // Kept buffer `handle` of slot `slot` (ActivationDeclarations::keep).
  template <class T = kernels::Act>
  T* kept(int slot, int handle) const {
    const Place& p = places_[handle];
    size_t at = p.offset;
    if (p.where == Place::shared) at += slot * slot_bytes_;
    else if (p.where == Place::own) at += own_at_[p.chunk] + bound_[slot] * own_bytes_[p.chunk];
    return reinterpret_cast<T*>(base_ + at);
  }

 private:
  // Where a kept buffer is: in the shared slots (slot s's from s * slot_bytes), in its
  // chunk's own slots (from own_at[chunk], own_bytes[chunk] each), or in one place for
  // every slot (dropped: the recompute set's); offset within the slot, or in the allocation.
  struct Place {
    enum Where { shared, own, fixed } where = shared;
    size_t offset = 0;
    int chunk = 0;
  };
  // Where each buffer goes (offsets into one allocation) and the bytes by part.
  struct Plan {
    ActivationBytes bytes;
    std::vector<Place> kept;                 // per handle
    size_t slot_bytes = 0;                   // of each shared slot
    std::vector<size_t> own_at, own_bytes;   // per chunk: where its own slots begin, the bytes of each
    std::vector<int> chunk_slots;            // per chunk: how many own slots
    std::vector<size_t> scratch;             // per scratch name
  };
  static Plan plan(const ActivationDeclarations& declared);

  ActivationShape shape_;
  ActivationBytes bytes_;
  std::vector<Place> places_;
  std::vector<size_t> own_at_, own_bytes_;
  std::vector<int> chunk_slots_;  // per chunk: its own slots
  std::vector<int> bound_;        // per slot: its chunk's own slot
  size_t slot_bytes_ = 0;
  char* base_ = nullptr;
  kernels::DeviceBuffer memory_;
};

}  // namespace trident
