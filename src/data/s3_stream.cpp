#include "data/s3_stream.h"

#include <algorithm>
#include <cstdio>
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

}  // namespace

std::unique_ptr<TokenDataset> open_streamed_megatron_dataset(const std::string& uri, const S3Object& bin,
                                                             const S3Settings& settings, size_t cache_bytes) {
  const S3Uri u = parse_s3_uri(uri);
  auto client = std::make_unique<S3Client>(u.bucket, settings, std::make_shared<AwsCredentialProvider>());
  const std::string idx_key = u.prefix + ".idx";
  std::optional<std::string> idx = client->get_object(idx_key);
  require(idx.has_value(), "data.path '" + uri + "': no index " + client->url_of(idx_key) +
                               " (data.stream reads a Megatron prefix: its .bin and .idx)");
  auto tokens = std::make_unique<StreamedTokens>(std::move(client), bin.key, bin.size, bin.etag, cache_bytes);
  return open_megatron_dataset(uri, *idx, std::move(tokens));
}

}  // namespace trident
