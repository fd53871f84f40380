#include "data/s3_stream.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <future>
#include <list>
#include <map>
#include <utility>
#include <vector>

#include "data/indexed_dataset.h"
#include "kernels/base/error.h"
#include "storage/s3_uri.h"

namespace trident {

namespace {

// An object's bytes by ranged GETs, each range kept (exactly as asked) in an LRU cache.
class StreamedTokens final : public TokenBytes {
 public:
  StreamedTokens(std::unique_ptr<S3Client> client, std::string key, uint64_t size, std::string etag, size_t cache_bytes)
      : client_(std::move(client)), key_(std::move(key)), size_(size), etag_(std::move(etag)),
        cache_bytes_(cache_bytes) {}

  ~StreamedTokens() override {
    client_->cancel();  // a fetch still retrying would hold this rank up while the run ends
    settle();
  }

  uint64_t size() const override { return size_; }
  bool local() const override { return false; }

  const uint8_t* bytes(uint64_t offset, size_t n, std::vector<uint8_t>&) const override {
    settle();
    read_bytes_ += n;
    const Range range{offset, n};
    auto it = cached_.find(range);
    if (it != cached_.end()) {
      if (!it->second.fresh) hit_bytes_ += n;  // fetched for an earlier read
      recent_.splice(recent_.begin(), recent_, it->second.used);  // most recently used first
    } else {
      fetch({range});
      it = cached_.find(range);
    }
    it->second.fresh = false;
    return reinterpret_cast<const uint8_t*>(it->second.bytes.data());
  }

  void prefetch(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const override {
    settle();
    // What is cached already is about to be read: most recently used, so that fetching the
    // rest does not put it out.
    for (const auto& r : ranges)
      if (const auto it = cached_.find(r); it != cached_.end()) recent_.splice(recent_.begin(), recent_, it->second.used);
    const std::vector<Range> missing = not_cached(ranges);
    if (!missing.empty()) fetch(missing);
  }

  // The next step's, while this one computes: its GETs run on a thread of their own, and
  // the next read waits for them (so the cache and the client are one thread's at a time).
  void prefetch_in_background(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const override {
    settle();
    std::vector<Range> missing = not_cached(ranges);
    if (missing.empty()) return;
    background_ = std::async(std::launch::async, [this, missing = std::move(missing)] { fetch(missing); });
  }

  std::string traffic() const override {
    settle();
    char text[200];
    std::snprintf(text, sizeof text, "streamed from S3: %llu ranged GETs, %.3f MB fetched for %.3f MB read (%.1f%% from the cache)",
                  static_cast<unsigned long long>(gets_), fetched_bytes_ / 1e6, read_bytes_ / 1e6,
                  read_bytes_ > 0 ? 100.0 * hit_bytes_ / read_bytes_ : 0.0);
    return text;
  }

 private:
  using Range = std::pair<uint64_t, uint64_t>;  // offset, bytes
  struct Entry {
    std::string bytes;
    std::list<Range>::iterator used;
    bool fresh = true;  // fetched for a read to come (not a cache hit when it comes)
  };

  // Waits for the background fetch, if any. One that failed (after the client's retries)
  // costs nothing but its ranges: the step that reads them fetches them itself, and that
  // fetch's error, if the store is still failing, ends the run.
  void settle() const {
    if (!background_.valid()) return;
    try {
      background_.get();
    } catch (const std::exception&) {
    }
  }
  std::vector<Range> not_cached(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const {
    std::vector<Range> missing;
    for (const auto& r : ranges)
      if (!cached_.contains(r) && std::find(missing.begin(), missing.end(), r) == missing.end()) missing.push_back(r);
    return missing;
  }

  void fetch(const std::vector<Range>& ranges) const {
    for (const Range& r : ranges)
      check(r.first + r.second <= size_, "a streamed read past the end of " + client_->url_of(key_));
    std::vector<std::string> got = client_->get_ranges(key_, ranges, etag_);
    gets_ += ranges.size();
    for (size_t i = 0; i < ranges.size(); i++) {
      fetched_bytes_ += got[i].size();
      held_ += got[i].size();
      recent_.push_front(ranges[i]);
      cached_[ranges[i]] = Entry{std::move(got[i]), recent_.begin(), true};
    }
    // The least recently used out, but never what this fetch brought (about to be read).
    while (held_ > cache_bytes_ && recent_.size() > ranges.size()) {
      const auto old = cached_.find(recent_.back());
      held_ -= old->second.bytes.size();
      cached_.erase(old);
      recent_.pop_back();
    }
  }

  std::unique_ptr<S3Client> client_;
  std::string key_;
  uint64_t size_;
  std::string etag_;
  size_t cache_bytes_;
  mutable std::map<Range, Entry> cached_;
  mutable std::list<Range> recent_;  // most recently used first
  mutable size_t held_ = 0;
  mutable uint64_t gets_ = 0;
  mutable double fetched_bytes_ = 0, read_bytes_ = 0, hit_bytes_ = 0;
  mutable std::future<void> background_;
};

// A token file streamed (StreamedTokens) until its copy on disk is complete, then mapped.
// The bytes are the same either way, so each rank switches on its own, between batches.
class TokensBeingCopied final : public TokenBytes {
 public:
  TokensBeingCopied(std::unique_ptr<StreamedTokens> streamed, std::string name, std::string copy_path,
                    std::function<bool()> copied, bool announce)
      : streamed_(std::move(streamed)), name_(std::move(name)), copy_path_(std::move(copy_path)),
        copied_(std::move(copied)), announce_(announce) {}

  uint64_t size() const override { return streamed_ ? streamed_->size() : copy_->size(); }
  bool local() const override { return false; }  // its ids checked per batch, as when streamed from the start
  const uint8_t* bytes(uint64_t offset, size_t n, std::vector<uint8_t>& scratch) const override {
    return copy_ ? copy_->bytes(offset, n, scratch) : streamed_->bytes(offset, n, scratch);
  }
  void prefetch(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const override {
    if (switch_if_copied()) return;
    streamed_->prefetch(ranges);
  }
  void prefetch_in_background(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const override {
    if (switch_if_copied()) return;
    streamed_->prefetch_in_background(ranges);
  }
  std::string traffic() const override {
    return copy_ ? streamed_traffic_ + "; then from its copy on disk" : streamed_->traffic() + " (its copy not done yet)";
  }

 private:
  // True once reading from the copy (the streamed source and its cache let go then).
  bool switch_if_copied() const {
    if (copy_) return true;
    if (!copied_()) return false;
    std::unique_ptr<TokenBytes> copy = map_token_file(copy_path_);
    check(copy->size() == streamed_->size(), copy_path_ + ": a verified copy of another size than the object's");
    streamed_traffic_ = streamed_->traffic();
    streamed_.reset();  // waits for its background fetch, if any
    copy_ = std::move(copy);
    if (announce_) {
      std::printf("data: %s: its copy is complete, read from %s from now on (%s before)\n", name_.c_str(),
                  copy_path_.c_str(), streamed_traffic_.c_str());
      std::fflush(stdout);
    }
    return true;
  }

  mutable std::unique_ptr<StreamedTokens> streamed_;
  mutable std::unique_ptr<TokenBytes> copy_;
  mutable std::string streamed_traffic_;
  std::string name_, copy_path_;
  std::function<bool()> copied_;
  bool announce_;
};

// A client of s3://bucket/prefix's bucket.
std::unique_ptr<S3Client> client_of(const std::string& uri, const S3Settings& settings) {
  return std::make_unique<S3Client>(parse_s3_uri(uri).bucket, settings, std::make_shared<AwsCredentialProvider>());
}

// The index of s3://bucket/prefix, through `client` (a UsageError when there is none).
std::string read_index(S3Client& client, const std::string& uri) {
  const std::string idx_key = parse_s3_uri(uri).prefix + ".idx";
  std::optional<std::string> idx = client.get_object(idx_key);
  require(idx.has_value(), "data.path '" + uri + "': no index " + client.url_of(idx_key) +
                               " (data.stream reads a Megatron prefix: its .bin and .idx)");
  return std::move(*idx);
}

}  // namespace

std::unique_ptr<TokenDataset> open_megatron_dataset_being_copied(const std::string& uri, const S3Object& bin,
                                                                 const S3Settings& settings, size_t cache_bytes,
                                                                 const std::string& local_prefix,
                                                                 std::function<bool()> copied, bool announce) {
  auto streamed =
      std::make_unique<StreamedTokens>(client_of(uri, settings), bin.key, bin.size, bin.etag, cache_bytes);
  std::ifstream in(local_prefix + ".idx", std::ios::binary);
  require(in.good(), "data.path '" + uri + "': its index was not copied to " + local_prefix + ".idx");
  const std::string idx((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return open_megatron_dataset(uri, idx, std::make_unique<TokensBeingCopied>(std::move(streamed), uri,
                                                                               local_prefix + ".bin", std::move(copied),
                                                                               announce));
}

std::unique_ptr<TokenDataset> open_streamed_megatron_dataset(const std::string& uri, const S3Object& bin,
                                                             const S3Settings& settings, size_t cache_bytes) {
  std::unique_ptr<S3Client> client = client_of(uri, settings);
  const std::string idx = read_index(*client, uri);
  auto tokens = std::make_unique<StreamedTokens>(std::move(client), bin.key, bin.size, bin.etag, cache_bytes);
  return open_megatron_dataset(uri, idx, std::move(tokens));
}

}  // namespace trident
