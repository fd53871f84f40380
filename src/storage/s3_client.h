// A client of one S3 bucket (AWS, or an S3-compatible store at an endpoint): objects,
// listings, and files moved in parts over parallel connections. Requests are signed
// with SigV4 by libcurl; every body's SHA-256 is signed with it, so the store refuses a
// part that changed on the way. A request the store may answer better later (503 Slow
// Down, 500, a refused or broken connection) is retried with exponential backoff and
// full jitter until settings.retry_s have passed; one it refuses (403, 404) is not.
// A host name that does not resolve, where no request to it has been answered yet in this
// process, is a UsageError at once (a wrong endpoint, or AWS's host where no endpoint was
// set on a machine that cannot reach AWS): no retries for it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <functional>
#include <vector>

#include "runtime/exit_codes.h"
#include "storage/aws_credentials.h"
#include "storage/http.h"

namespace trident {

struct S3Settings {
  std::string endpoint;  // http(s)://host[:port] of an S3-compatible store; empty: AWS's
  std::string endpoint_from;  // what set it (storage/s3_endpoint.h), named when its host does not resolve
  std::string region;
  size_t part_bytes = size_t{64} << 20;  // of a multipart transfer (at least 5 MiB)
  int parallel = 8;                      // parts in flight
  double retry_s = 120;                  // how long one request keeps being retried
  long stall_s = 30;                     // a connection that moves under 1 KB/s this long is dropped
};

inline constexpr size_t kS3MinPartBytes = size_t{5} << 20;
inline constexpr int kS3MaxParts = 10000;

// The part size of a file of `bytes`: `min_part`, grown (whole MiB) to fit 10,000 parts.
size_t s3_part_bytes(uint64_t bytes, size_t min_part);
// What an upload of a file of `bytes` holds in memory: a part per transfer in flight.
size_t s3_upload_buffer_bytes(uint64_t bytes, const S3Settings& settings);

// The store's refusal (status and S3 error code), or a request that kept failing. Left
// uncaught it ends a run as infrastructure (exit 3); callers that know better (a missing
// bucket, a refused object) turn it into a UsageError.
class S3Error : public InfrastructureError {
 public:
  S3Error(const std::string& what, long status, std::string code)
      : InfrastructureError(what), status(status), code(std::move(code)) {}
  // No answer, the store failing or throttling: a later try may succeed.
  bool retryable() const { return status == 0 || status == 429 || status >= 500; }
  long status;       // 0: no answer (transport_error in what())
  std::string code;  // S3's <Code>: NoSuchBucket, AccessDenied, SignatureDoesNotMatch, ...
};

// Requests made, by kind, and what the retries were for (thread-safe counters).
struct S3Counts {
  std::atomic<uint64_t> put{0}, get{0}, head{0}, list{0}, post{0}, del{0};
  std::atomic<uint64_t> retries{0}, slowdowns{0};  // slowdowns: 503 answers among the retries
  std::atomic<uint64_t> bytes_up{0}, bytes_down{0};
};

struct S3Object {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // as listed, quotes and all
};

struct S3Transfer {
  uint64_t bytes = 0;
  int parts = 0;
  double seconds = 0;
  uint64_t requests = 0, retries = 0, slowdowns = 0;  // this transfer's own (retries included in requests)
  uint32_t crc32 = 0;  // of the bytes (zlib's CRC-32, as checkpoint manifests hold)
  std::string etag;    // an upload's: the object's ETag as the store gave it, quotes and all
};

class S3Client {
 public:
  S3Client(std::string bucket, S3Settings settings, std::shared_ptr<AwsCredentialProvider> credentials);

  // UsageError if the bucket cannot be used: missing, wrong credentials, no permission.
  // Lists one key under `prefix`: UsageError if refused, InfrastructureError if no answer.
  void check_bucket(const std::string& prefix = "");
  // Makes the bucket (the tests and benchmarks; a run never makes one).
  void create_bucket();
  void put_object(const std::string& key, std::string_view data);
  std::optional<std::string> get_object(const std::string& key);  // nullopt: no such key
  std::optional<uint64_t> object_size(const std::string& key);
  // Whether the object is encrypted with SSE-KMS or SSE-C (its ETag is then no MD5).
  bool encrypted(const std::string& key);    // HEAD; nullopt: no such key
  // Every key under `prefix`, in key order, in pages of `page_keys` (S3's most: 1000).
  std::vector<S3Object> list(const std::string& prefix, int page_keys = 1000);
  void delete_object(const std::string& key);

  // The file as one object: one PUT up to a part, else a multipart upload, parts in
  // parallel, a part grown where the file would need more than 10,000. An upload that
  // fails is aborted (the store frees its parts).
  S3Transfer upload_file(const std::string& path, const std::string& key);
  // `size` bytes of the object into `path` (written whole, then synced), ranged GETs in
  // parallel; the CRC-32 of what arrived, combined from the ranges'.
  // if_match: the ETag the object must still have (412 Precondition Failed else), so that
  // the ranges of an object replaced meanwhile are not mixed.
  S3Transfer download_file(const std::string& key, uint64_t size, const std::string& path,
                           const std::string& if_match = "");

  // Byte ranges [offset, offset + length) of one object, each a ranged GET, up to
  // settings.parallel at once; each comes back whole (S3Error else). if_match as above.
  std::vector<std::string> get_ranges(const std::string& key, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                                      const std::string& if_match = "");

  // From another thread: abandon transfers and retries now (they throw S3Error).
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  const S3Counts& counts() const { return counts_; }
  const S3Settings& settings() const { return settings_; }
  std::string url_of(const std::string& key) const;  // for messages (no credentials in it)
  size_t part_bytes_for(uint64_t bytes) const { return s3_part_bytes(bytes, settings_.part_bytes); }

 private:
  struct Request;
  // Sends a request until it succeeds, retrying what may succeed later; S3Error else.
  // A 404 comes back as the response when the request allows it.
  HttpResponse send(HttpSession& http, const Request& request);
  // One ranged GET of [offset, offset + length) (If-Match: if_match when given): `take` gets
  // the body's pieces in order (false, with `refused` set, refuses it: not retried),
  // `restart` runs before each attempt; S3Error unless exactly `length` bytes came.
  void get_range(HttpSession& http, const std::string& key, uint64_t offset, uint64_t length,
                 const std::string& if_match, const std::function<void()>& restart,
                 const std::function<bool(const char*, size_t, std::string& refused)>& take);
  // Returns the object's ETag.
  std::string complete_upload(HttpSession& http, const Request& complete, uint64_t bytes,
                              const std::vector<std::string>& part_etags);
  std::string bucket_url() const;
  // What to say when the store's host name does not resolve: which host, and where an
  // endpoint is set.
  std::string unresolved_host_error(const std::string& host) const;
  void sleep_before_retry(int attempt);

  std::string bucket_;
  S3Settings settings_;
  std::shared_ptr<AwsCredentialProvider> credentials_;
  S3Counts counts_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace trident
