#include "data/s3_data.h"

#include <fnmatch.h>
#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "config/s3_settings.h"
#include "parallel/agreement.h"
#include "parallel/node_leaders.h"
#include "runtime/byte_size.h"
#include "runtime/durable_file.h"
#include "runtime/injected_faults.h"
#include "runtime/timer.h"
#include "data/dataset_prefix_help.h"
#include "data/s3_stream.h"
#include "storage/background_priority.h"
#include "storage/file_md5.h"
#include "storage/s3_client.h"
#include "storage/s3_endpoint.h"
#include "storage/s3_uri.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

std::vector<std::string> words_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

bool has_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// Whether an entry's key (a glob, a file, a folder or a Megatron prefix) names `key`.
bool named_by(const std::string& pattern, const std::string& key) {
  if (key.empty() || key.back() == '/') return false;  // a folder marker
  // A ".." segment would put the copy outside the cache.
  if (key == ".." || key.starts_with("../") || key.find("/../") != std::string::npos || key.ends_with("/.."))
    return false;
  if (has_glob(pattern)) return fnmatch(pattern.c_str(), key.c_str(), FNM_PATHNAME) == 0;
  if (pattern.empty() || key == pattern) return true;                                  // the bucket; a file
  if (key.starts_with(pattern + "/")) return true;                                     // a folder's files
  return key.starts_with(pattern + ".") && key.find('/', pattern.size()) == std::string::npos;  // prefix.bin, .idx
}

// One object to copy, and where its copy and its record go.
struct DataObject {
  std::string bucket, key, etag;
  uint64_t size = 0;
  S3Object object() const { return {key, size, etag}; }
  bool same_as(const DataObject& o) const { return bucket == o.bucket && key == o.key; }
};

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DataObject, bucket, key, etag, size)

// A Megatron prefix read where it is (data.stream): its entry, and its token file as listed.
struct StreamedEntry {
  std::string uri;
  DataObject bin;
};

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StreamedEntry, uri, bin)

std::string copy_path(const std::string& cache, const DataObject& o) {
  return (fs::path(cache) / o.bucket / o.key).string();
}

// What a verified copy was made from (beside the data, not among it: a text folder's
// reader takes every file of the folder).
std::string record_path(const std::string& cache, const DataObject& o) {
  return (fs::path(cache) / ".trident-s3" / o.bucket / (o.key + ".json")).string();
}

int64_t mtime_ns(const std::string& path) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(fs::last_write_time(path).time_since_epoch()).count();
}

// A copy made from this object (its ETag and size) and not changed since (its size and
// modification time as recorded).
bool copy_is_current(const std::string& cache, const DataObject& o) {
  try {
    const std::string path = copy_path(cache, o);
    std::error_code ec;
    if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) != o.size) return false;
    std::ifstream in(record_path(cache, o));
    const nlohmann::json r = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    return r.is_object() && r.value("etag", "") == o.etag && r.value("size", uint64_t{0}) == o.size &&
           r.value("mtime_ns", int64_t{0}) == mtime_ns(path);
  } catch (const std::exception&) {  // a record that is not ours, a file gone meanwhile: copy again
    return false;
  }
}

// The MD5 in an ETag ("<32 hex>", an object put whole without SSE-KMS); empty otherwise
// (a multipart ETag "<hex>-N", an encrypted object's).
std::string etag_md5(const std::string& etag) {
  std::string hex = etag;
  std::erase(hex, '"');
  if (hex.size() != 32 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) return "";
  return hex;
}

// What a verified copy was made from, beside the data.
void record(const std::string& cache, const DataObject& o) {
  fs::create_directories(fs::path(record_path(cache, o)).parent_path());
  write_text_atomically(record_path(cache, o),
                        nlohmann::json{{"etag", o.etag}, {"size", o.size}, {"mtime_ns", mtime_ns(copy_path(cache, o))}}.dump() +
                            "\n");
}

// Downloads one object to its copy (through a .partial file, so that a cut download never
// looks whole), checks its MD5 where the ETag has one, and records what it was made from.
uint64_t fetch(S3Client& client, const std::string& cache, const DataObject& o, const std::string& writer) {
  const std::string path = copy_path(cache, o), partial = path + ".partial." + writer;  // one per writer
  fs::create_directories(fs::path(path).parent_path());
  fs::create_directories(fs::path(record_path(cache, o)).parent_path());
  client.download_file(o.key, o.size, partial, o.etag);  // every range of the listed object
  // An ETag that looks like an MD5 but is not one (SSE-KMS, SSE-C): the size and If-Match
  // above are the check then.
  const std::string md5 = etag_md5(o.etag);
  if (!md5.empty() && file_md5(partial, [&client] { return client.cancelled(); }) != md5 &&
      !client.encrypted(o.key)) {
    fs::remove(partial);
    throw InfrastructureError("s3://" + o.bucket + "/" + o.key + ": the copy's MD5 is not the object's ETag " + o.etag);
  }
  fs::rename(partial, path);  // over another writer's finished copy of the same object: the same bytes
  record(cache, o);
  return o.size;
}

// The objects every s3:// entry of `spec` names (rank 0; UsageError for an entry that
// names nothing, a bucket that cannot be used).
// stream: a Megatron prefix (its .bin and .idx there) goes into `streamed` instead (data.stream);
// defer: its token file goes into `deferred` (copied while training reads it), the rest into objects.
void list_entries(const std::string& key_name, const std::string& spec, const S3Settings& settings, bool stream,
                  bool defer, std::vector<DataObject>& objects, std::vector<StreamedEntry>& streamed,
                  std::vector<StreamedEntry>& deferred) {
  for (const std::string& word : words_of(spec)) {
    if (!is_s3_uri(word)) continue;
    const S3Uri uri = parse_s3_uri(word);
    S3Client client(uri.bucket, settings, std::make_shared<AwsCredentialProvider>());
    // A dataset's .bin or .idx: listed from its stem, to see whether its pair is there.
    const bool one_file = !has_glob(uri.prefix) && (uri.prefix.ends_with(".bin") || uri.prefix.ends_with(".idx"));
    const std::string listed_under =
        one_file ? uri.prefix.substr(0, uri.prefix.size() - 4) : uri.prefix.substr(0, uri.prefix.find_first_of("*?["));
    client.check_bucket(listed_under);
    std::vector<DataObject> found;
    std::vector<std::string> keys;  // all listed, for the "pass the prefix" help
    for (const S3Object& o : client.list(listed_under)) {
      keys.push_back(o.key);
      if (named_by(uri.prefix, o.key)) found.push_back({uri.bucket, o.key, o.etag, o.size});
    }
    require(!found.empty(), key_name + " '" + word + "' names no object in S3 (a Megatron prefix with its .bin and .idx, "
                                                     "a glob of shards, a file or a folder)");
    if (one_file) {
      const std::string stem = listed_under;
      refuse_one_file_of_dataset(key_name, word, std::count(keys.begin(), keys.end(), stem + ".bin") +
                                                     std::count(keys.begin(), keys.end(), stem + ".idx") == 2);
    }
    const auto named = [&](const std::string& key) {
      return std::find_if(found.begin(), found.end(), [&](const DataObject& o) { return o.key == key; });
    };
    const auto bin = named(uri.prefix + ".bin");
    const bool megatron = !has_glob(uri.prefix) && bin != found.end() && named(uri.prefix + ".idx") != found.end();
    if (!megatron && !has_glob(uri.prefix)) {  // a folder holding prepared datasets
      std::vector<std::string> inside;
      for (const DataObject& o : found)
        if (o.key.starts_with(uri.prefix + "/") || uri.prefix.empty()) inside.push_back("s3://" + uri.bucket + "/" + o.key);
      refuse_folder_of_datasets(key_name, word, megatron_prefixes(inside));
    }
    if (megatron && stream) {
      streamed.push_back({word, *bin});
    } else if (megatron && defer) {
      deferred.push_back({word, *bin});
      for (const DataObject& o : found)
        if (o.key != bin->key) objects.push_back(o);
    } else {
      objects.insert(objects.end(), found.begin(), found.end());
    }
  }
}

// What the readers would take besides the listed objects under an entry's copy (a shard
// deleted from S3 since an earlier copy, the .partial file of a killed run): removed, so
// that the run reads what S3 holds now and nothing else.
void remove_unlisted(const std::string& spec, const std::string& cache, const std::set<std::string>& listed) {
  for (const std::string& word : words_of(spec)) {
    if (!is_s3_uri(word)) continue;
    const std::string local = local_copy_of(word, cache);
    std::vector<std::string> found;
    std::error_code ec;
    if (has_glob(local)) {
      glob_t g{};
      if (glob(local.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) found.emplace_back(g.gl_pathv[i]);
      globfree(&g);
    } else if (fs::is_directory(local, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(local, ec))
        if (e.is_regular_file(ec)) found.push_back(e.path().string());
    }
    for (const std::string& f : found)
      if (!listed.contains(fs::path(f).lexically_normal().string())) fs::remove(f, ec);
  }
}

// `path`'s .partial files that writers of this host left (`path`.partial.<host>.<pid>): a
// killed run's (a copy that ends, or is cancelled, removes its own).
void remove_partials(const std::string& path, const std::string& host) {
  std::error_code ec;
  const fs::path dir = fs::path(path).parent_path();
  const std::string start = fs::path(path).filename().string() + ".partial." + host + ".";
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(start, 0) == 0) fs::remove(e.path(), ec);
}

// The entries with their copies' paths, but those read from S3 (left as s3://).
std::string with_local_copies(const std::string& spec, const std::string& cache,
                              const std::vector<StreamedEntry>& streamed) {
  if (!names_s3(spec)) return spec;
  std::string out;
  for (const std::string& word : words_of(spec)) {
    const bool copied = is_s3_uri(word) && std::none_of(streamed.begin(), streamed.end(),
                                                        [&](const StreamedEntry& e) { return e.uri == word; });
    out += (out.empty() ? "" : " ") + (copied ? local_copy_of(word, cache) : word);
  }
  return out;
}

// A node leader's copies of the token files that training reads meanwhile (deferred), one
// after the other on a thread at idle priority. A copy that fails is reported and left:
// the run goes on reading that file from S3. Cancelled when the run ends first (its
// .partial removed: the next run fetches it again).
class LeaderCopies final : public DataInBackground {
 public:
  LeaderCopies(std::vector<DataObject> objects, std::string cache, const S3Settings& settings, std::string writer,
               bool announce)
      : objects_(std::move(objects)), cache_(std::move(cache)), writer_(std::move(writer)), announce_(announce) {
    for (const DataObject& o : objects_)  // made here: the destructor cancels them from this thread
      if (!clients_.contains(o.bucket))
        clients_[o.bucket] = std::make_unique<S3Client>(o.bucket, settings, std::make_shared<AwsCredentialProvider>());
  }
  ~LeaderCopies() override {
    for (auto& [bucket, client] : clients_) client->cancel();
    if (thread_.joinable()) thread_.join();
  }
  void start() override {
    if (!started_) thread_ = std::thread([this] { copy_all(); });
    started_ = true;
  }
  void wait() override {
    start();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void copy_all() {
    run_in_background();
    for (const DataObject& o : objects_) {
      if (copy_is_current(cache_, o)) continue;  // another leader's, on a shared folder
      const Timer timer;
      try {
        fetch(*clients_.at(o.bucket), cache_, o, writer_);
        if (announce_)
          std::printf("data: copied s3://%s/%s in the background (%s in %.2f s)\n", o.bucket.c_str(), o.key.c_str(),
                      byte_size(static_cast<double>(o.size)).c_str(), timer.seconds());
      } catch (const std::exception& e) {
        std::error_code ec;
        fs::remove(copy_path(cache_, o) + ".partial." + writer_, ec);
        if (clients_.at(o.bucket)->cancelled()) return;  // the run ended first
        std::fprintf(stderr, "data: warning: copying s3://%s/%s in the background failed (%s); the run goes on "
                     "reading it from S3\n", o.bucket.c_str(), o.key.c_str(), e.what());
      }
      std::fflush(stdout);
    }
  }

  std::vector<DataObject> objects_;
  std::string cache_, writer_;
  bool announce_;
  std::map<std::string, std::unique_ptr<S3Client>> clients_;  // one per bucket
  std::thread thread_;
  bool started_ = false;
};

}  // namespace

void remember_copy(const std::string& cache_dir, const std::string& bucket, const std::string& key,
                   const std::string& etag, uint64_t size) {
  record(cache_dir, DataObject{bucket, key, etag, size});
}

bool names_s3(const std::string& data_path) {
  for (const std::string& word : words_of(data_path))
    if (is_s3_uri(word)) return true;
  return false;
}

std::string local_copy_of(const std::string& uri, const std::string& cache_dir) {
  const S3Uri u = parse_s3_uri(uri);
  return (fs::path(cache_dir) / u.bucket / u.prefix).string();
}

S3Settings data_s3_settings(const Config& config) {
  const bool own = !config.data.s3_endpoint.empty();
  return s3_settings(config.checkpoint, resolve_s3_endpoint(own ? config.data.s3_endpoint : config.checkpoint.s3_endpoint,
                                                            own ? "data.s3_endpoint" : "checkpoint.s3_endpoint"));
}

std::string data_cache_dir(const DataConfig& data) {
  if (!data.cache_dir.empty()) return data.cache_dir;
  const char* slurm = std::getenv("SLURM_TMPDIR");
  return (fs::path(slurm != nullptr && *slurm != '\0' ? slurm : "/tmp") / "trident-data").string();
}

std::shared_ptr<DataInBackground> copy_in_background(const std::string& bucket, const std::vector<S3Object>& objects,
                                                     const std::string& cache_dir, const S3Settings& settings,
                                                     const std::string& writer, bool announce) {
  std::vector<DataObject> listed;
  for (const S3Object& o : objects) listed.push_back({bucket, o.key, o.etag, o.size});
  return std::make_shared<LeaderCopies>(std::move(listed), cache_dir, settings, writer, announce);
}

ListedData list_s3_data(const Config& config) {
  const DataConfig& data = config.data;
  ListedData listed;
  if (!names_s3(data.path) && !names_s3(data.val_path)) return listed;
  const S3Settings settings = data_s3_settings(config);
  std::vector<DataObject> objects;
  std::vector<StreamedEntry> streamed, deferred;
  list_entries("data.path", data.path, settings, /*stream=*/true, /*defer=*/false, objects, streamed, deferred);
  list_entries("data.val_path", data.val_path, settings, /*stream=*/true, /*defer=*/false, objects, streamed, deferred);
  for (const std::string& word : words_of(data.path + " " + data.val_path)) {
    const bool opened = std::any_of(streamed.begin(), streamed.end(), [&](const StreamedEntry& e) { return e.uri == word; });
    if (is_s3_uri(word) && !opened) listed.listed_only.push_back(word);
  }
  for (const DataObject& o : objects) listed.bytes += static_cast<double>(o.size);
  for (const StreamedEntry& e : streamed) listed.bytes += static_cast<double>(e.bin.size);
  listed.objects = objects.size() + 2 * streamed.size();
  const size_t cache_bytes = size_t{16} << 20;  // the check reads a sample of the tokens once
  listed.open_remote = [streamed, settings, cache_bytes](const std::string& uri) -> std::unique_ptr<TokenDataset> {
    const auto e = std::find_if(streamed.begin(), streamed.end(), [&](const StreamedEntry& s) { return s.uri == uri; });
    check(e != streamed.end(), "an s3:// entry listed, not a Megatron prefix, opened: " + uri);
    return open_streamed_megatron_dataset(uri, e->bin.object(), settings, cache_bytes);
  };
  return listed;
}

StagedData stage_s3_data(const Config& config, ParallelState& parallel, bool copy_while_reading) {
  DataConfig data = config.data;
  if (!names_s3(data.path) && !names_s3(data.val_path)) {
    if (data.stream && parallel.is_root())  // not silently ignored
      std::printf("data: data.stream=true streams s3:// Megatron prefixes only; data.path %s is read from disk\n",
                  data.path.c_str());
    return {data, {}, nullptr};
  }
  const std::string cache = data_cache_dir(data);
  // Rank 0 lists what the entries name; every rank learns it.
  std::vector<DataObject> objects;
  std::vector<StreamedEntry> streamed, deferred;
  const bool defer = !data.wait_for_copy;
  S3Settings settings;
  run_collectively([&] {
    settings = data_s3_settings(config);  // every rank's (a bad endpoint or region: one error on every rank)
    if (!parallel.is_root()) return;
    list_entries("data.path", data.path, settings, data.stream, defer, objects, streamed, deferred);
    list_entries("data.val_path", data.val_path, settings, data.stream, defer, objects, streamed, deferred);
  });
  const nlohmann::json listed = nlohmann::json::parse(broadcast_string(
      nlohmann::json{{"objects", objects}, {"streamed", streamed}, {"deferred", deferred}}.dump()));
  objects = listed.at("objects").get<std::vector<DataObject>>();
  streamed = listed.at("streamed").get<std::vector<StreamedEntry>>();
  deferred.clear();  // each token file once, though data.path and val_path both name it
  for (const StreamedEntry& e : listed.at("deferred").get<std::vector<StreamedEntry>>())
    if (std::none_of(deferred.begin(), deferred.end(), [&](const StreamedEntry& d) { return d.bin.same_as(e.bin); }))
      deferred.push_back(e);
  // A token file copied while training reads it, where this node has no copy of it yet:
  // streamed until the node leader's copy is there.
  std::vector<StreamedEntry> being_copied;
  for (const StreamedEntry& e : deferred)
    if (!copy_is_current(cache, e.bin)) being_copied.push_back(e);
  if (parallel.is_root())
    for (const StreamedEntry& s : streamed)
      std::printf("data: streaming %s (data.stream: ranged GETs as batches need them, %d MB cached per rank)\n",
                  s.uri.c_str(), data.stream_cache_mb);
  // Each rank opens a streamed entry with what rank 0 listed (no listing of its own).
  require((streamed.empty() && being_copied.empty()) || data.stream_cache_mb > 0,
          "data.stream_cache_mb must be positive");
  const size_t cache_bytes = static_cast<size_t>(data.stream_cache_mb) << 20;
  const bool announce = parallel.is_root();
  RemoteOpener open_streamed = [streamed, being_copied, cache, settings, cache_bytes,
                                announce](const std::string& uri) -> std::unique_ptr<TokenDataset> {
    const auto named = [&](const StreamedEntry& s) { return s.uri == uri; };
    if (const auto e = std::find_if(being_copied.begin(), being_copied.end(), named); e != being_copied.end()) {
      const DataObject bin = e->bin;
      return open_megatron_dataset_being_copied(uri, bin.object(), settings, cache_bytes,
                                                local_copy_of(uri, cache),
                                                [cache, bin] { return copy_is_current(cache, bin); }, announce);
    }
    const auto e = std::find_if(streamed.begin(), streamed.end(), named);
    check(e != streamed.end(), "an s3:// entry neither copied nor streamed: " + uri);
    return open_streamed_megatron_dataset(uri, e->bin.object(), settings, cache_bytes);
  };
  if (objects.empty()) return {data, open_streamed, nullptr};  // all streamed
  std::sort(objects.begin(), objects.end(), [](const DataObject& a, const DataObject& b) {
    return std::tie(a.bucket, a.key) < std::tie(b.bucket, b.key);
  });
  objects.erase(std::unique(objects.begin(), objects.end(),
                            [](const DataObject& a, const DataObject& b) { return a.same_as(b); }),
                objects.end());

  // Each node leader fetches what its node lacks; on a shared folder, its share of it.
  const NodeLeaders leaders = node_leaders(parallel);
  bool shared = false;
  run_collectively([&] { shared = shared_folder(parallel, cache); });
  std::vector<const DataObject*> mine;
  double kept = 0;
  if (leaders.leader)
    for (size_t i = 0; i < objects.size(); i++) {
      if (shared && static_cast<int>(i) % leaders.count != leaders.index) continue;
      if (copy_is_current(cache, objects[i])) kept++;
      else mine.push_back(&objects[i]);
    }
  double to_fetch = 0;
  for (const DataObject* o : mine) to_fetch += static_cast<double>(o->size);
  double plan[2] = {to_fetch, kept};
  parallel.world().all_reduce(std::span<double>(plan, 2));
  if (parallel.is_root() && plan[0] > 0)
    std::printf("data: copying %s of s3:// data to %s (%zu objects, %.0f already there)\n", byte_size(plan[0]).c_str(),
                cache.c_str(), objects.size(), plan[1]);
  std::fflush(stdout);

  // The others wait for the leaders in the reduction below: lift the wait's bound for the
  // copy (parallel.timeout_s, plus the time of the largest share at 50 MB/s: a leader
  // slower than that is taken for stuck).
  const double most = parallel.world().all_reduce(to_fetch, ReduceOp::max);
  const double bound = parallel.wait_bound_s();
  parallel.set_wait_bound_s(bound + most / 50e6);
  char host_name[256] = "host";
  gethostname(host_name, sizeof host_name - 1);
  const std::string host = host_name, writer = host + "." + std::to_string(getpid());
  std::string error;
  bool usage = false;
  double fetched = 0, files = 0;
  const Timer timer;
  if (!mine.empty()) {
    try {
      std::map<std::string, std::unique_ptr<S3Client>> clients;  // one per bucket
      double last_line = 0;
      for (const DataObject* o : mine) {
        auto& client = clients[o->bucket];
        if (!client) client = std::make_unique<S3Client>(o->bucket, settings, std::make_shared<AwsCredentialProvider>());
        fetched += static_cast<double>(fetch(*client, cache, *o, writer));
        files++;
        // Rank 0's own share, as it goes (every 2 s): bytes, rate, time left.
        const double seconds = timer.seconds();
        if (parallel.is_root() && seconds - last_line >= 2 && fetched < to_fetch) {
          const double rate = fetched / seconds;
          std::printf("data: copied %s of %s (%.3f GB/s), ETA %.0f s\n", byte_size(fetched).c_str(), byte_size(to_fetch).c_str(),
                      rate / 1e9, (to_fetch - fetched) / rate);
          std::fflush(stdout);
          last_line = seconds;
        }
      }
    } catch (const UsageError& e) {
      error = e.what();
      usage = true;
    } catch (const std::exception& e) {  // the store (after its retries), the local disk
      error = e.what();
    }
  }
  const double seconds = timer.seconds();
  double totals[4] = {fetched, files, error.empty() ? 0.0 : 1.0, usage ? 1.0 : 0.0};
  parallel.world().all_reduce(std::span<double>(totals, 4));
  const double slowest = parallel.world().all_reduce(seconds, ReduceOp::max);
  parallel.set_wait_bound_s(bound);
  if (totals[2] > 0) {
    std::string said;
    for (const std::string& e : parallel.world().gather_strings(error))
      if (!e.empty()) said += (said.empty() ? "" : "; ") + e;
    said = broadcast_string("copying the s3:// data to " + cache + " failed: " + said);
    if (totals[3] > 0) throw AgreedUsageError(said);
    throw AgreedInfrastructureError(said);
  }
  if (parallel.is_root() && totals[1] > 0)
    std::printf("data: copied %.0f object%s, %s, in %.2f s (%.3f GB/s); %.0f already there\n", totals[1],
                totals[1] == 1 ? "" : "s", byte_size(totals[0]).c_str(), slowest, totals[0] / std::max(slowest, 1e-9) / 1e9,
                plan[1]);
  else if (parallel.is_root() && being_copied.empty())
    std::printf("data: the s3:// data's %zu objects are in %s already\n", objects.size() + deferred.size(),
                cache.c_str());
  std::fflush(stdout);
  // The token files this leader copies while training reads them (on a shared folder its
  // share of them, as above).
  std::vector<DataObject> to_copy;
  if (leaders.leader) {
    std::set<std::string> listed;
    for (const DataObject& o : objects) listed.insert(fs::path(copy_path(cache, o)).lexically_normal().string());
    for (const StreamedEntry& e : deferred) listed.insert(fs::path(copy_path(cache, e.bin)).lexically_normal().string());
    remove_unlisted(data.path, cache, listed);
    remove_unlisted(data.val_path, cache, listed);
    for (size_t i = 0; i < being_copied.size(); i++) {
      remove_partials(copy_path(cache, being_copied[i].bin), host);  // what a killed run of this host left
      if (!shared || static_cast<int>(i) % leaders.count == leaders.index) to_copy.push_back(being_copied[i].bin);
    }
  }
  if (announce && !being_copied.empty() && !copy_while_reading) {
    for (const StreamedEntry& e : being_copied)
      std::printf("data: %s read with ranged GETs (no copy of it here)\n", e.uri.c_str());
  } else if (announce && !being_copied.empty()) {
    double bytes = 0;
    for (const StreamedEntry& e : being_copied) bytes += static_cast<double>(e.bin.size);
    std::printf("data: training starts while %zu token file%s (%s) %s copied to %s; until then %s read with ranged "
                "GETs (data.wait_for_copy=true waits for the copy)\n",
                being_copied.size(), being_copied.size() == 1 ? "" : "s", byte_size(bytes).c_str(),
                being_copied.size() == 1 ? "is" : "are", cache.c_str(), being_copied.size() == 1 ? "it is" : "they are");
    std::fflush(stdout);
  }
  parallel.world().barrier();
  std::shared_ptr<DataInBackground> background;
  if (!to_copy.empty() && copy_while_reading) {
    background = std::make_shared<LeaderCopies>(std::move(to_copy), cache, settings, writer, announce);
    if (!injected_faults::holds_data_copy()) background->start();
  }
  std::vector<StreamedEntry> remote = streamed;  // left s3://, opened by open_streamed
  remote.insert(remote.end(), being_copied.begin(), being_copied.end());
  data.path = with_local_copies(data.path, cache, remote);
  data.val_path = with_local_copies(data.val_path, cache, remote);
  return {data, open_streamed, background};
}

}  // namespace trident
