#include "ckpt/remote_checkpoints.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "config/s3_settings.h"
#include "runtime/exit_codes.h"

namespace fs = std::filesystem;

namespace trident {

RemoteCheckpoints::RemoteCheckpoints(const std::string& uri, const CheckpointConfig& c)
    : uri_(parse_s3_uri(uri)), credentials_(std::make_shared<AwsCredentialProvider>()),
      client_(std::make_unique<S3Client>(uri_.bucket, s3_settings(c), credentials_)) {}

std::string RemoteCheckpoints::describe() const {
  return uri_.str() + " (" + (client_->settings().endpoint.empty() ? "AWS S3" : client_->settings().endpoint) +
         ", region " + client_->settings().region + ", credentials: " + credentials_->describe() + ")";
}

std::optional<std::string> RemoteCheckpoints::latest() {
  std::optional<std::string> text = client_->get_object(uri_.key("latest"));
  if (!text) return std::nullopt;
  while (!text->empty() && std::isspace(static_cast<unsigned char>(text->back()))) text->pop_back();
  return text;
}

std::vector<RemoteCheckpoints::Step> RemoteCheckpoints::steps() {
  std::map<std::string, Step> by_name;
  for (const S3Object& o : client_->list(uri_.key("step_"))) {
    const std::string relative = uri_.relative(o.key);
    const size_t slash = relative.find('/');
    if (slash == std::string::npos) continue;
    Step& s = by_name[relative.substr(0, slash)];
    s.name = relative.substr(0, slash);
    s.bytes += o.size;
    if (relative.substr(slash + 1) == "manifest.json") s.complete = true;
  }
  std::vector<Step> out;
  for (auto& [name, s] : by_name) out.push_back(s);  // zero-padded step numbers sort in order
  return out;
}

std::optional<std::string> RemoteCheckpoints::manifest_text(const std::string& step) {
  return client_->get_object(key(step, "manifest.json"));
}

Manifest RemoteCheckpoints::manifest(const std::string& step, const std::string& local_dir) {
  const std::optional<std::string> text = manifest_text(step);
  require(text.has_value(), client_->url_of(key(step, "manifest.json")) + " is missing: the checkpoint is incomplete");
  return parse_manifest(*text, local_dir, client_->url_of(key(step, "manifest.json")));
}

std::vector<std::string> RemoteCheckpoints::resume_candidates() {
  std::vector<std::string> candidates;
  for (const Step& s : steps())
    if (s.complete) candidates.push_back(s.name);
  if (const std::optional<std::string> named = latest()) {
    const auto it = std::find(candidates.begin(), candidates.end(), *named);
    if (it != candidates.end()) {
      candidates.erase(it);
      candidates.push_back(*named);
    }
  }
  std::reverse(candidates.begin(), candidates.end());
  return candidates;
}

void RemoteCheckpoints::commit(const std::string& step, const std::string& manifest_text) {
  client_->put_object(key(step, "manifest.json"), manifest_text);
  client_->put_object(uri_.key("latest"), step + "\n");
}

std::vector<std::string> RemoteCheckpoints::prune(int keep_last, const std::string& committed) {
  // Only what is older than the step just committed: a newer folder may be an upload in
  // flight, or left by an earlier run that `latest` no longer names.
  std::vector<Step> all;
  for (const Step& s : steps())
    if (s.name <= committed) all.push_back(s);
  std::vector<std::string> complete;
  for (const Step& s : all)
    if (s.complete) complete.push_back(s.name);
  if (complete.empty()) return {};
  std::vector<std::string> doomed;
  for (size_t i = 0; keep_last > 0 && i + keep_last < complete.size(); i++) doomed.push_back(complete[i]);
  for (const Step& s : all)
    if (!s.complete && s.name < committed) doomed.push_back(s.name);
  for (const std::string& step : doomed) {
    // The manifest first: a step half deleted no longer counts as complete.
    client_->delete_object(key(step, "manifest.json"));
    for (const S3Object& o : client_->list(uri_.key(step + "/"))) client_->delete_object(o.key);
  }
  return doomed;
}

S3Transfer RemoteCheckpoints::download(const std::string& step, const ManifestFile& f, const std::string& path) {
  // A name of this process's own: on a shared file system several node leaders may fetch
  // the same file at once; each renames a complete copy into place.
  const std::string tmp = path + ".download." + std::to_string(getpid());
  const std::string url = client_->url_of(key(step, f.name));
  S3Transfer t;
  try {
    t = client_->download_file(key(step, f.name), f.bytes, tmp);
  } catch (const S3Error& e) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    // No answer, or the store failing, is for a retry of the job; a refusal (a missing or
    // short object) makes this checkpoint unusable.
    if (e.status == 0 || e.status >= 500) throw InfrastructureError(e.what());
    throw UsageError(e.what());
  }
  if (t.crc32 != f.crc32) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    char crcs[64];
    std::snprintf(crcs, sizeof crcs, "CRC-32 %08x, the manifest says %08x", t.crc32, f.crc32);
    throw UsageError(url + " does not match its manifest (" + crcs + "): corrupted, refused");
  }
  fs::rename(tmp, path);
  return t;
}

}  // namespace trident
