#include "storage/s3_client.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <pugixml.hpp>

#include "runtime/exit_codes.h"
#include "runtime/timer.h"
#include "storage/background_priority.h"
#include "storage/s3_endpoint.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

std::string digest_hex(std::string_view data, const EVP_MD* kind) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  check(EVP_Digest(data.data(), data.size(), digest, &length, kind, nullptr) == 1, "EVP_Digest failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; i++) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::string_view data) { return digest_hex(data, EVP_sha256()); }

// The ETag S3 gives an object completed from these parts (their ETags, each the MD5 of
// the part in hex): the MD5 of their binary MD5s, "-" and the number of parts. Empty when
// a part's ETag is not an MD5 (SSE-KMS encrypted parts).
std::string multipart_etag(const std::vector<std::string>& part_etags) {
  std::string md5s;
  for (std::string etag : part_etags) {
    etag.erase(std::remove(etag.begin(), etag.end(), '"'), etag.end());
    if (etag.size() != 32 || etag.find_first_not_of("0123456789abcdef") != std::string::npos) return "";
    for (size_t i = 0; i < 32; i += 2) md5s += static_cast<char>(std::stoi(etag.substr(i, 2), nullptr, 16));
  }
  return "\"" + digest_hex(md5s, EVP_md5()) + "-" + std::to_string(part_etags.size()) + "\"";
}

// The canonical query SigV4 signs: parameters sorted by name, names and values encoded,
// "name=" for a parameter without a value. Given so, any libcurl signs it correctly.
std::string canonical_query(std::vector<std::pair<std::string, std::string>> parameters) {
  std::sort(parameters.begin(), parameters.end());
  std::string q;
  for (const auto& [name, value] : parameters)
    q += (q.empty() ? "" : "&") + uri_encode(name, false) + "=" + uri_encode(value, false);
  return q;
}

std::string xml_text(const pugi::xml_node& node, const char* child) { return node.child(child).text().as_string(); }

struct StoreError {
  std::string code, message;
};

StoreError store_error(const std::string& body) {
  pugi::xml_document doc;
  if (!doc.load_string(body.c_str())) return {};
  const pugi::xml_node e = doc.child("Error");
  return {xml_text(e, "Code"), xml_text(e, "Message")};
}

// What the store's refusals mean for the user.
std::string hint(const std::string& code) {
  if (code == "SignatureDoesNotMatch") return ": the secret key does not match the access key";
  if (code == "InvalidAccessKeyId") return ": the store knows no such access key";
  if (code == "NoSuchBucket") return ": the bucket does not exist";
  if (code == "AccessDenied") return ": these credentials may not do this";
  if (code == "InvalidRange") return ": the object is shorter than expected (truncated?)";
  if (code == "ExpiredToken") return ": the session token has expired";
  return "";
}

bool retryable(long status, const std::string& code) {
  if (status == 0 || status >= 500 || status == 429) return true;  // no answer, 500, 502, 503 Slow Down, 504
  return status == 400 && code == "RequestTimeout";                 // the store gave up waiting on a slow body
}

class FileDescriptor {
 public:
  FileDescriptor(const std::string& path, int flags) : fd_(::open(path.c_str(), flags | O_CLOEXEC, 0644)) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Work split in numbered pieces among up to `workers` threads; the first error stops the
// others and is rethrown.
void in_parallel(int pieces, int workers, const std::function<void(int piece, HttpSession& http)>& work) {
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first;
  std::mutex mutex;
  const auto run = [&] {
    HttpSession http;  // one connection per thread, kept open between its pieces
    for (int i = next++; i < pieces && !failed; i = next++) {
      try {
        work(i, http);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!failed.exchange(true)) first = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < std::min(workers, pieces); t++) threads.emplace_back(run);
  run();
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// The hosts that have answered a request of this process: one of them that stops
// resolving is a passing fault of DNS (retried), not a wrong name.
class AnsweringHosts {
 public:
  void add(const std::string& host) {
    const std::lock_guard<std::mutex> lock(mutex_);
    hosts_.insert(host);
  }
  bool contains(const std::string& host) {
    const std::lock_guard<std::mutex> lock(mutex_);
    return hosts_.contains(host);
  }

 private:
  std::mutex mutex_;
  std::set<std::string> hosts_;
};

AnsweringHosts& answering_hosts() {
  static AnsweringHosts hosts;
  return hosts;
}

}  // namespace

struct S3Client::Request {
  std::string method = "GET";
  std::string key;  // empty: the bucket
  std::string query;
  std::string_view body;
  std::vector<std::string> headers;
  std::function<bool(const char*, size_t)> on_body;
  std::function<void()> before_attempt;  // resets what on_body gathered
  bool missing_ok = false;               // a 404 is an answer, not an error
  S3Counts* tally = nullptr;  // a transfer's own counts, besides the client's
  // Set by on_body when it refuses the body (a local write failed, more bytes than asked):
  // not the store's doing, so not retried.
  std::string* refused = nullptr;
};

S3Client::S3Client(std::string bucket, S3Settings settings, std::shared_ptr<AwsCredentialProvider> credentials)
    : bucket_(std::move(bucket)), settings_(std::move(settings)), credentials_(std::move(credentials)) {
  while (!settings_.endpoint.empty() && settings_.endpoint.back() == '/') settings_.endpoint.pop_back();
}

std::string S3Client::bucket_url() const {
  if (!settings_.endpoint.empty()) return settings_.endpoint + "/" + bucket_;  // path style
  // AWS: virtual-hosted style, but for a name with '.' (TLS's wildcard covers one label).
  if (bucket_.find('.') == std::string::npos) return "https://" + bucket_ + ".s3." + settings_.region + ".amazonaws.com";
  return "https://s3." + settings_.region + ".amazonaws.com/" + bucket_;
}

std::string S3Client::url_of(const std::string& key) const { return "s3://" + bucket_ + "/" + key; }

size_t s3_part_bytes(uint64_t bytes, size_t min_part) {
  const uint64_t fits = (bytes + kS3MaxParts - 1) / kS3MaxParts;
  const uint64_t mib = uint64_t{1} << 20;
  return std::max<uint64_t>(min_part, (fits + mib - 1) / mib * mib);
}

size_t s3_upload_buffer_bytes(uint64_t bytes, const S3Settings& settings) {
  const uint64_t part = s3_part_bytes(bytes, settings.part_bytes);
  const uint64_t parts = std::max<uint64_t>(1, (bytes + part - 1) / part);
  // Each of the `parallel` workers keeps one part's buffer; a single-part file is read whole.
  return std::min<uint64_t>(bytes, std::min<uint64_t>(parts, static_cast<uint64_t>(settings.parallel)) * part);
}

std::string S3Client::unresolved_host_error(const std::string& host) const {
  const std::string set_it = "data.s3_endpoint (s3:// data), checkpoint.s3_endpoint, or the environment's "
                             "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL";
  if (settings_.endpoint.empty())
    return "S3: the host " + host + " (AWS S3, region " + settings_.region + ", for s3://" + bucket_ +
           ") does not resolve: this machine cannot reach AWS S3 by name. For an S3-compatible store, set its "
           "http(s)://host:port in " + set_it;
  const std::string from = settings_.endpoint_from.empty() ? "" : " (from " + settings_.endpoint_from + ")";
  return "S3: the endpoint " + settings_.endpoint + from + " names the host " + host +
         ", which does not resolve: give the store's http(s)://host:port in " + set_it;
}

void S3Client::sleep_before_retry(int attempt) {
  // Full jitter (AWS's advice): uniform in [0, min(cap, base * 2^attempt)].
  thread_local std::mt19937_64 random(std::random_device{}());
  const double ceiling = std::min(10.0, 0.1 * std::pow(2.0, std::min(attempt, 20)));
  const double seconds = std::uniform_real_distribution<double>(0.0, ceiling)(random);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!cancelled_ && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

HttpResponse S3Client::send(HttpSession& http, const Request& r) {
  const std::string what = r.method + " " + url_of(r.key) + (r.query.empty() ? "" : "?" + r.query);
  const std::string payload_hash = r.body.empty() ? sha256_hex("") : sha256_hex(r.body);
  const Timer since;
  for (int attempt = 0;; attempt++) {
    if (cancelled_) throw S3Error(what + ": cancelled", 0, "Cancelled");
    keep_background_moving();
    const AwsCredentials c = credentials_->get();
    HttpRequest h;
    h.method = r.method;
    h.url = bucket_url() + (r.key.empty() ? "" : "/" + uri_encode(r.key, true)) + (r.query.empty() ? "" : "?" + r.query);
    h.headers = r.headers;
    h.headers.push_back("x-amz-content-sha256: " + payload_hash);
    if (!c.session_token.empty()) h.headers.push_back("x-amz-security-token: " + c.session_token);
    h.body = r.body;
    h.sigv4 = "aws:amz:" + settings_.region + ":s3";
    h.access_key = c.access_key;
    h.secret_key = c.secret_key;
    h.stall_s = settings_.stall_s;
    h.on_body = r.on_body;
    h.cancel = &cancelled_;
    if (r.before_attempt) r.before_attempt();
    (r.method == "PUT" ? counts_.put : r.method == "HEAD" ? counts_.head : r.method == "POST" ? counts_.post
     : r.method == "DELETE" ? counts_.del : r.key.empty() ? counts_.list : counts_.get)++;
    if (r.tally != nullptr) r.tally->put++;  // a transfer counts its requests in one figure
    HttpResponse response = http.perform(h);
    if (r.refused != nullptr && !r.refused->empty()) throw S3Error(what + ": " + *r.refused, -1, "Refused");
    const std::string host = url_host(h.url);
    if (response.status != 0) answering_hosts().add(host);
    if (response.host_unresolved && !answering_hosts().contains(host)) throw UsageError(unresolved_host_error(host));
    if (response.status / 100 == 2 || (r.missing_ok && response.status == 404)) {
      if (r.method == "PUT" || r.method == "POST") counts_.bytes_up += r.body.size();
      return response;
    }
    const StoreError e = store_error(response.body);
    const std::string said = response.status == 0 ? "no answer (" + response.transport_error + ")"
                                                  : std::to_string(response.status) + (e.code.empty() ? "" : " " + e.code) +
                                                        (e.message.empty() ? "" : " (" + e.message + ")") + hint(e.code);
    if (cancelled_) throw S3Error(what + ": cancelled", 0, "Cancelled");
    if (!retryable(response.status, e.code)) throw S3Error(what + ": " + said, response.status, e.code);
    if (since.seconds() > settings_.retry_s)
      throw S3Error(what + ": " + said + ", still after " + std::to_string(attempt + 1) + " attempts in " +
                        std::to_string(static_cast<int>(since.seconds())) + " s",
                    response.status, e.code);
    counts_.retries++;
    if (response.status == 503) counts_.slowdowns++;
    if (r.tally != nullptr) {
      r.tally->retries++;
      if (response.status == 503) r.tally->slowdowns++;
    }
    sleep_before_retry(attempt);
  }
}

// CompleteMultipartUpload, treated as S3 asks: a 200 may carry an <Error> (S3 fails a long
// completion that way: an InternalError is sent again, within retry_s), and a try whose
// answer was lost after the store did it leaves its retry a 404 NoSuchUpload (the upload
// is an object now): then the object under the key, of the file's size and with the ETag
// these parts make, shows that the completion took.
std::string S3Client::complete_upload(HttpSession& http, const Request& complete, uint64_t bytes,
                                      const std::vector<std::string>& part_etags) {
  const std::string what = "POST " + url_of(complete.key) + " (complete)";
  const Timer since;
  for (int attempt = 0;; attempt++) {
    StoreError e;
    std::string body;
    try {
      body = send(http, complete).body;
      e = store_error(body);
    } catch (const S3Error& error) {
      if (error.code != "NoSuchUpload") throw;
      Request head;
      head.method = "HEAD";
      head.key = complete.key;
      head.missing_ok = true;
      const HttpResponse object = send(http, head);
      // The ETag these parts make (AWS, Ceph); a store that gives assembled objects ETags of
      // its own (s3rver: the whole object's MD5, no "-N") or parts without MD5 ETags: the size.
      const std::string expected = multipart_etag(part_etags), etag = object.header("etag");
      const bool ours = object.status == 200 && object.header("content-length") == std::to_string(bytes) &&
                        (etag == expected || expected.empty() || etag.find('-') == std::string::npos);
      if (ours) return etag;
      throw;
    }
    if (e.code.empty()) {
      pugi::xml_document doc;
      doc.load_string(body.c_str());
      return xml_text(doc.child("CompleteMultipartUploadResult"), "ETag");
    }
    const bool transient = e.code == "InternalError" || e.code == "ServiceUnavailable" || e.code == "SlowDown";
    if (!transient || since.seconds() > settings_.retry_s)
      throw S3Error(what + ": 200 carrying " + e.code + " (" + e.message + ")", 200, e.code);
    counts_.retries++;
    sleep_before_retry(attempt);
  }
}

void S3Client::check_bucket(const std::string& prefix) {
  HttpSession http;
  Request r;
  // Under the prefix: a policy may allow listing there alone (an s3:prefix condition).
  // ListObjects V1, as list() below.
  r.query = canonical_query({{"max-keys", "1"}, {"prefix", prefix}});
  try {
    send(http, r);
  } catch (const S3Error& e) {
    const std::string what = std::string("S3 bucket s3://") + bucket_ + " cannot be used: " + e.what();
    if (e.retryable()) throw InfrastructureError(what);  // the store down: a retry of the job may do
    throw UsageError(what);
  }
}

void S3Client::create_bucket() {
  HttpSession http;
  Request r;
  r.method = "PUT";
  send(http, r);
}

void S3Client::put_object(const std::string& key, std::string_view data) {
  HttpSession http;
  Request r;
  r.method = "PUT";
  r.key = key;
  r.body = data;
  send(http, r);
}

std::optional<std::string> S3Client::get_object(const std::string& key) {
  HttpSession http;
  Request r;
  r.key = key;
  r.missing_ok = true;
  HttpResponse response = send(http, r);
  if (response.status == 404) {
    if (store_error(response.body).code == "NoSuchBucket")
      throw S3Error("GET " + url_of(key) + ": 404 NoSuchBucket" + hint("NoSuchBucket"), 404, "NoSuchBucket");
    return std::nullopt;
  }
  counts_.bytes_down += response.body.size();
  return std::move(response.body);
}

std::optional<uint64_t> S3Client::object_size(const std::string& key) {
  HttpSession http;
  Request r;
  r.method = "HEAD";
  r.key = key;
  r.missing_ok = true;
  const HttpResponse response = send(http, r);
  if (response.status == 404) return std::nullopt;
  return std::stoull(response.header("content-length").empty() ? "0" : response.header("content-length"));
}

// ListObjects V1, paged by `marker` (the last key of the page before): every S3 store
// answers it (AWS, Ceph's gateway, s3rver) and it needs no token made by the server. V2's
// continuation tokens are where s3rver 3.7 fails: it makes them with DES, which the
// OpenSSL 3 of Node 17 and later refuses, so every truncated V2 page is a 500 there.
bool S3Client::encrypted(const std::string& key) {
  HttpSession http;
  Request r;
  r.method = "HEAD";
  r.key = key;
  const HttpResponse response = send(http, r);
  return response.header("x-amz-server-side-encryption").starts_with("aws:kms") ||
         !response.header("x-amz-server-side-encryption-customer-algorithm").empty();
}

std::vector<S3Object> S3Client::list(const std::string& prefix, int page_keys) {
  HttpSession http;
  std::vector<S3Object> objects;
  std::string marker;
  for (;;) {
    std::vector<std::pair<std::string, std::string>> parameters = {{"max-keys", std::to_string(page_keys)},
                                                                   {"prefix", prefix}};
    if (!marker.empty()) parameters.emplace_back("marker", marker);
    Request r;
    r.query = canonical_query(parameters);
    const HttpResponse response = send(http, r);
    pugi::xml_document doc;
    check(static_cast<bool>(doc.load_string(response.body.c_str())), "S3 list of " + url_of(prefix) + ": not XML");
    const pugi::xml_node result = doc.child("ListBucketResult");
    const size_t before = objects.size();
    for (const pugi::xml_node c : result.children("Contents"))
      objects.push_back({xml_text(c, "Key"), c.child("Size").text().as_ullong(), xml_text(c, "ETag")});
    if (std::string(xml_text(result, "IsTruncated")) != "true") break;
    check(objects.size() > before, "S3 list of " + url_of(prefix) + ": a truncated page without keys");
    marker = xml_text(result, "NextMarker");  // only with a delimiter; else the page's last key
    if (marker.empty()) marker = objects.back().key;
  }
  std::sort(objects.begin(), objects.end(), [](const S3Object& a, const S3Object& b) { return a.key < b.key; });
  return objects;
}

void S3Client::delete_object(const std::string& key) {
  HttpSession http;
  Request r;
  r.method = "DELETE";
  r.key = key;
  r.missing_ok = true;  // gone already: what was asked
  send(http, r);
}

S3Transfer S3Client::upload_file(const std::string& path, const std::string& key) {
  const Timer timer;
  S3Transfer t;
  t.bytes = fs::file_size(path);
  const size_t part = part_bytes_for(t.bytes);
  t.parts = static_cast<int>(std::max<uint64_t>(1, (t.bytes + part - 1) / part));
  const FileDescriptor file(path, O_RDONLY);
  check(file.get() >= 0, "cannot open " + path + " to upload it");
  std::vector<uint32_t> crcs(t.parts);
  const auto read_part = [&](int i, std::vector<char>& buffer) {
    const uint64_t offset = static_cast<uint64_t>(i) * part, length = std::min<uint64_t>(part, t.bytes - offset);
    buffer.resize(length);
    for (uint64_t done = 0; done < length;) {
      const ssize_t n = ::pread(file.get(), buffer.data() + done, length - done, static_cast<off_t>(offset + done));
      check(n > 0, path + ": read failed (changed while uploading?)");
      done += static_cast<uint64_t>(n);
    }
    crcs[i] = static_cast<uint32_t>(crc32_z(0L, reinterpret_cast<const Bytef*>(buffer.data()), length));  // parts may pass 4 GiB
  };
  S3Counts tally;
  const auto finish = [&] {
    t.requests = tally.put;
    t.retries = tally.retries;
    t.slowdowns = tally.slowdowns;
    t.seconds = timer.seconds();
  };
  if (t.parts == 1) {
    std::vector<char> buffer;
    read_part(0, buffer);
    HttpSession http;
    Request put;
    put.method = "PUT";
    put.key = key;
    put.body = std::string_view(buffer.data(), buffer.size());
    put.tally = &tally;
    t.etag = send(http, put).header("etag");
    t.crc32 = crcs[0];
    finish();
    return t;
  }
  HttpSession http;
  Request start;
  start.tally = &tally;
  start.method = "POST";
  start.key = key;
  start.query = canonical_query({{"uploads", ""}});
  pugi::xml_document doc;
  doc.load_string(send(http, start).body.c_str());
  const std::string upload_id = xml_text(doc.child("InitiateMultipartUploadResult"), "UploadId");
  check(!upload_id.empty(), "S3 " + url_of(key) + ": the store started a multipart upload without an UploadId");
  std::vector<std::string> etags(t.parts);
  try {
    in_parallel(t.parts, settings_.parallel, [&](int i, HttpSession& session) {
      thread_local std::vector<char> buffer;
      read_part(i, buffer);
      Request put;
      put.method = "PUT";
      put.key = key;
      put.tally = &tally;
      put.query = canonical_query({{"partNumber", std::to_string(i + 1)}, {"uploadId", upload_id}});
      put.body = std::string_view(buffer.data(), buffer.size());
      etags[i] = send(session, put).header("etag");
      check(!etags[i].empty(), "S3 " + url_of(key) + ": part " + std::to_string(i + 1) + " stored without an ETag");
    });
    std::string xml = "<CompleteMultipartUpload>";
    for (int i = 0; i < t.parts; i++)
      xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + etags[i] + "</ETag></Part>";
    xml += "</CompleteMultipartUpload>";
    Request complete;
    complete.tally = &tally;
    complete.method = "POST";
    complete.key = key;
    complete.query = canonical_query({{"uploadId", upload_id}});
    complete.body = xml;
    complete.headers = {"Content-Type: application/xml"};
    t.etag = complete_upload(http, complete, t.bytes, etags);
  } catch (...) {
    // The parts cost storage until aborted; best effort, the error that matters is above.
    try {
      Request abort;
      abort.method = "DELETE";
      abort.key = key;
      abort.query = canonical_query({{"uploadId", upload_id}});
      abort.missing_ok = true;
      if (!cancelled_) send(http, abort);  // cancelled: the job is ending; the store's lifecycle rule cleans up
    } catch (const std::exception&) {
    }
    throw;
  }
  t.crc32 = crcs[0];
  for (int i = 1; i < t.parts; i++) {
    const uint64_t length = std::min<uint64_t>(part, t.bytes - static_cast<uint64_t>(i) * part);
    t.crc32 = static_cast<uint32_t>(crc32_combine(t.crc32, crcs[i], static_cast<z_off_t>(length)));
  }
  finish();
  return t;
}

void S3Client::get_range(HttpSession& http, const std::string& key, uint64_t offset, uint64_t length,
                         const std::string& if_match, const std::function<void()>& restart,
                         const std::function<bool(const char*, size_t, std::string& refused)>& take) {
  uint64_t received = 0;
  std::string refused;
  Request get;
  get.key = key;
  get.refused = &refused;
  get.headers = {"Range: bytes=" + std::to_string(offset) + "-" + std::to_string(offset + length - 1)};
  if (!if_match.empty()) get.headers.push_back("If-Match: " + if_match);
  get.before_attempt = [&] {
    received = 0;
    restart();
  };
  get.on_body = [&](const char* data, size_t n) {
    if (received + n > length) {
      refused = "more bytes than the " + std::to_string(length) + " asked for: not the object expected";
      return false;
    }
    if (!take(data, n, refused)) return false;
    received += n;
    return true;
  };
  send(http, get);
  if (received != length)
    throw S3Error("GET " + url_of(key) + ": bytes " + std::to_string(offset) + "-" + std::to_string(offset + length - 1) +
                      " came back " + std::to_string(received) +
                      " bytes long: the object is shorter than expected (truncated?)",
                  206, "Truncated");
  counts_.bytes_down += length;
}

std::vector<std::string> S3Client::get_ranges(const std::string& key,
                                              const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                                              const std::string& if_match) {
  std::vector<std::string> out(ranges.size());
  in_parallel(static_cast<int>(ranges.size()), settings_.parallel, [&](int i, HttpSession& session) {
    std::string& body = out[i];
    if (ranges[i].second == 0) return;
    get_range(session, key, ranges[i].first, ranges[i].second, if_match, [&] { body.clear(); },
              [&](const char* data, size_t n, std::string&) {
                body.append(data, n);
                return true;
              });
  });
  return out;
}

S3Transfer S3Client::download_file(const std::string& key, uint64_t size, const std::string& path,
                                   const std::string& if_match) {
  const Timer timer;
  S3Transfer t;
  t.bytes = size;
  const size_t part = part_bytes_for(size);
  t.parts = static_cast<int>(std::max<uint64_t>(1, (size + part - 1) / part));
  {
    const FileDescriptor file(path, O_WRONLY | O_CREAT | O_TRUNC);
    check(file.get() >= 0, "cannot create " + path + " to download into it");
    check(::ftruncate(file.get(), static_cast<off_t>(size)) == 0, "cannot size " + path);
    std::vector<uint32_t> crcs(t.parts);
    if (size > 0) {
      in_parallel(t.parts, settings_.parallel, [&](int i, HttpSession& session) {
        const uint64_t offset = static_cast<uint64_t>(i) * part, length = std::min<uint64_t>(part, size - offset);
        uLong crc = 0;
        uint64_t written = 0;
        get_range(
            session, key, offset, length, if_match,
            [&] {
              written = 0;
              crc = crc32(0L, Z_NULL, 0);
            },
            [&](const char* data, size_t n, std::string& refused) {
              for (size_t done = 0; done < n;) {
                const ssize_t w = ::pwrite(file.get(), data + done, n - done, static_cast<off_t>(offset + written + done));
                if (w <= 0) {
                  refused = "cannot write " + path + ": " + std::strerror(errno);
                  return false;
                }
                done += static_cast<size_t>(w);
              }
              crc = crc32_z(crc, reinterpret_cast<const Bytef*>(data), n);
              written += n;
              return true;
            });
        crcs[i] = static_cast<uint32_t>(crc);
      });
    }
    check(::fsync(file.get()) == 0, "cannot sync " + path);
    t.crc32 = size == 0 ? 0 : crcs[0];
    for (int i = 1; i < t.parts; i++) {
      const uint64_t length = std::min<uint64_t>(part, size - static_cast<uint64_t>(i) * part);
      t.crc32 = static_cast<uint32_t>(crc32_combine(t.crc32, crcs[i], static_cast<z_off_t>(length)));
    }
  }
  t.seconds = timer.seconds();
  return t;
}

}  // namespace trident
