#include "ckpt/checkpoint_pieces.h"

#include <algorithm>

#include "kernels/base/error.h"

namespace trident {

namespace {

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::replicated: return "replicated";
    case Sharding::rows: return "rows";
    case Sharding::qkv_rows: return "qkv_rows";
    case Sharding::columns: return "columns";
  }
  return "?";
}

}  // namespace

std::vector<std::string> checkpoint_kinds(const std::vector<std::string>& optimizer_state) {
  std::vector<std::string> kinds = {"params"};
  kinds.insert(kinds.end(), optimizer_state.begin(), optimizer_state.end());
  return kinds;
}

bool CheckpointWriter::writes(const Placement& p) const {
  if (!p.counted) return false;
  const auto [at, fresh] = first_of_.try_emplace(p.data_axes());
  if (fresh) at->second = dims_.group_rank(coords_, p.data_axes()) == 0;
  return at->second;
}

std::vector<Piece> rank_pieces(const ParameterLayout& layout, const CheckpointWriter& writer,
                               const std::vector<KindSource>& sources) {
  return rank_pieces(layout.tensors(), writer, sources);
}

std::vector<Piece> rank_pieces(const std::vector<ParameterTensor>& tensors, const CheckpointWriter& writer,
                               const std::vector<KindSource>& sources) {
  std::vector<Piece> pieces;
  for (const ParameterTensor& t : tensors) {
    const Placement& p = t.placement;
    if (!writer.writes(p)) continue;
    for (const KindSource& source : sources)
      pieces.push_back({source.kind, t.name, sharding_name(p.sharding), t.shape, t.padded_shape[0], p.piece, p.pieces,
                        source.flat == nullptr ? nullptr : source.flat + t.offset, t.stored});
  }
  return pieces;
}

std::vector<bool> files_needed(const Manifest& m, const ParameterLayout& layout) {
  std::vector<bool> needed(m.files.size(), false);
  for (const ManifestFile& f : m.files)
    if (f.shards.empty()) return std::vector<bool>(m.files.size(), true);  // an older manifest: all
  std::vector<const ParameterTensor*> all;
  for (const ParameterTensor& t : layout.tensors()) all.push_back(&t);
  for (const ParameterTensor& b : layout.buffers()) all.push_back(&b);
  for (const ParameterTensor* declared : all) {
    const ParameterTensor& t = *declared;
    // Its own shard, saved under the same tp: that file alone. Else every shard of it.
    const ShardName own{t.name, t.placement.piece, t.placement.pieces};
    bool found = false;
    for (size_t i = 0; i < m.files.size() && !found; i++)
      if (std::find(m.files[i].shards.begin(), m.files[i].shards.end(), own) != m.files[i].shards.end())
        needed[i] = found = true;
    if (found) continue;
    for (size_t i = 0; i < m.files.size(); i++)
      for (const ShardName& s : m.files[i].shards)
        if (s.tensor == t.name) needed[i] = true;
  }
  return needed;
}

std::vector<std::vector<float>> read_rank_state(const Manifest& m, const ParameterLayout& layout,
                                                const std::vector<std::string>& kinds) {
  const ShardIndex index(m, files_needed(m, layout));
  const ParameterLayout saved(m.model, 0, m.dims.size(Axis::tp));
  std::vector<std::vector<float>> full(kinds.size(), std::vector<float>(layout.total_floats(), 0.0f));
  for (const ParameterTensor& t : layout.tensors())
    for (size_t k = 0; k < kinds.size(); k++) {
      // The same piece saved: this rank's shard is a dataset of its own. Otherwise
      // assemble the full tensor from the saved shards and cut the new shard from it.
      if (const auto* own = index.find(kinds[k], t.name, t.placement.piece, t.placement.pieces)) {
        const std::vector<float> shard = own->file->read_float(own->dataset);
        require(shard.size() == t.stored, own->file->path() + ": " + own->dataset + " has the wrong size");
        std::copy(shard.begin(), shard.end(), full[k].begin() + t.offset);
        continue;
      }
      const std::vector<float> canonical = index.canonical(m, saved, kinds[k], t.name);
      const std::vector<float> shard = layout.shard_of(t, canonical.data());
      std::copy(shard.begin(), shard.end(), full[k].begin() + t.offset);
    }
  return full;
}

std::vector<std::string> read_rank_buffers(const Manifest& m, const ParameterLayout& layout, float* flat) {
  std::vector<std::string> missing;
  if (layout.buffers().empty()) return missing;
  const ShardIndex index(m, files_needed(m, layout));
  const ParameterLayout saved(m.model, 0, m.dims.size(Axis::tp));
  for (const ParameterTensor& b : layout.buffers()) {
    if (const auto* own = index.find(kBuffers, b.name, b.placement.piece, b.placement.pieces)) {
      const std::vector<float> shard = own->file->read_float(own->dataset);
      require(shard.size() == b.stored, own->file->path() + ": " + own->dataset + " has the wrong size");
      std::copy(shard.begin(), shard.end(), flat + b.offset);
    } else if (index.shards.count({kBuffers, b.name}) > 0 && saved.find_buffer(b.name) != nullptr) {
      const std::vector<float> canonical = index.canonical(m, saved, kBuffers, b.name);
      const std::vector<float> shard = layout.shard_of(b, canonical.data());
      std::copy(shard.begin(), shard.end(), flat + b.offset);
    } else {
      missing.push_back(b.name);
    }
  }
  return missing;
}

}  // namespace trident
