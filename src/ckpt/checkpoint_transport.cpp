#include "ckpt/checkpoint_transport.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>

#include "ckpt/checkpoint_upload.h"
#include "parallel/agreement.h"
#include "runtime/injected_faults.h"

namespace trident {

namespace {

// A blob: the header's length, the header (JSON), the pieces' floats.
std::string packed_header(const std::vector<Piece>& pieces, size_t& floats) {
  nlohmann::json header = nlohmann::json::array();
  floats = 0;
  for (const Piece& p : pieces) {
    header.push_back({{"kind", p.kind}, {"name", p.name}, {"sharding", p.sharding}, {"shape", p.shape},
                      {"padded_rows", p.padded_rows}, {"tp_rank", p.tp_rank}, {"tp_size", p.tp_size},
                      {"count", p.count}});
    floats += p.count;
  }
  return header.dump();
}

}  // namespace

size_t packed_size(const std::vector<Piece>& pieces) {
  size_t floats = 0;
  return sizeof(uint64_t) + packed_header(pieces, floats).size() + floats * sizeof(float);
}

void pack(const std::vector<Piece>& pieces, std::vector<char>& blob) {
  size_t floats = 0;
  const std::string text = packed_header(pieces, floats);
  const uint64_t length = text.size();
  blob.resize(sizeof length + text.size() + floats * sizeof(float));  // keeps its capacity
  std::memcpy(blob.data(), &length, sizeof length);
  std::memcpy(blob.data() + sizeof length, text.data(), text.size());
  char* out = blob.data() + sizeof length + text.size();
  for (const Piece& p : pieces) {
    std::memcpy(out, p.data, p.count * sizeof(float));
    out += p.count * sizeof(float);
  }
}

std::vector<Piece> unpack(const std::vector<char>& blob) {
  uint64_t length = 0;
  std::memcpy(&length, blob.data(), sizeof length);
  const nlohmann::json header = nlohmann::json::parse(blob.begin() + sizeof length, blob.begin() + sizeof length + length);
  const char* data = blob.data() + sizeof length + length;
  std::vector<Piece> pieces;
  for (const auto& p : header) {
    const size_t count = p["count"];
    pieces.push_back({p["kind"].get<std::string>(), p["name"].get<std::string>(), p["sharding"].get<std::string>(),
                      p["shape"].get<std::vector<int64_t>>(), p["padded_rows"].get<int64_t>(),
                      p["tp_rank"].get<int64_t>(), p["tp_size"].get<int64_t>(), data, count});
    data += count * sizeof(float);
  }
  return pieces;
}

NodeLeaderTransport::NodeLeaderTransport(ParallelState& parallel) : parallel_(parallel) {
  // This node's file number: the number of node leaders before it.
  std::vector<double> leaders(parallel.world().size(), 0.0);
  leaders[parallel.rank()] = parallel.node().rank() == 0 ? 1.0 : 0.0;
  parallel.world().all_reduce(std::span<double>(leaders));
  for (int r = 0; r < parallel.rank(); r++) node_index_ += static_cast<int>(leaders[r]);
}

bool NodeLeaderTransport::keeps() const { return parallel_.node().rank() == 0; }

void NodeLeaderTransport::hand_over(int step, const std::vector<Piece>& pieces) {
  // In messages below 1 GiB. The buffers keep their memory between saves.
  Communicator& node = parallel_.node();
  constexpr uint64_t kChunk = uint64_t{1} << 30;
  node_blobs_.resize(node.rank() == 0 ? node.size() : 1);
  pack(pieces, node_blobs_[0]);
  if (node.rank() == 0) {
    for (int r = 1; r < node.size(); r++) {
      uint64_t size = 0;
      node.recv(std::as_writable_bytes(std::span(&size, 1)), r, 0);
      std::vector<char>& other = node_blobs_[r];
      other.resize(size);
      for (uint64_t done = 0; done < size; done += kChunk)
        node.recv(std::as_writable_bytes(std::span(other.data() + done, std::min(size - done, kChunk))), r, 1);
    }
  } else {
    const std::vector<char>& blob = node_blobs_[0];
    const uint64_t size = blob.size();
    injected_faults::while_handing_pieces(parallel_.rank(), step);
    node.send(std::as_bytes(std::span(&size, 1)), 0, 0);
    for (uint64_t done = 0; done < size; done += kChunk)
      node.send(std::as_bytes(std::span(blob.data() + done, std::min(size - done, kChunk))), 0, 1);
  }
}

ManifestFile NodeLeaderTransport::keep(int step, const std::string& step_dir) {
  std::vector<std::vector<Piece>> pieces_of_ranks;
  for (const std::vector<char>& blob : node_blobs_) pieces_of_ranks.push_back(unpack(blob));
  return write_node_file(step_dir, node_file_name(node_index_), step, pieces_of_ranks);
}

void upload_to_s3_if_missing(CheckpointUploader& uploader, ParallelState& parallel, int node_index,
                             const Manifest& m, const std::string& manifest_text) {
  std::string why_not;  // rank 0: empty to upload
  bool upload = false;
  run_collectively([&] {
    if (!parallel.is_root()) return;
    const std::optional<std::string>& latest = uploader.s3_latest();
    if (latest && step_of_name(*latest) >= m.step) return;  // S3 has it, or newer
    if (m.nodes != parallel.nodes())
      why_not = "it was saved on " + std::to_string(m.nodes) + " node(s), this run has " +
                std::to_string(parallel.nodes());
    upload = why_not.empty();
  });
  why_not = broadcast_string(why_not);
  upload = parallel.world().all_reduce(upload ? 1.0 : 0.0, ReduceOp::max) > 0;
  if (!why_not.empty() && parallel.is_root())
    std::printf("checkpoint: step %d is not in S3 and is not uploaded now (%s); the next checkpoint will be\n", m.step,
                why_not.c_str());
  if (!upload) return;
  if (parallel.is_root())
    std::printf("checkpoint: step %d is newer than S3's latest: uploading it\n", m.step);
  // Node leader i uploads node file i, as the saving run's leader i wrote it.
  const bool leader = parallel.node().rank() == 0;
  ManifestFile file;
  if (leader && node_index < static_cast<int>(m.files.size())) file = m.files[node_index];
  uploader.submit(m.step, m.dir, file, manifest_text);
}

}  // namespace trident
