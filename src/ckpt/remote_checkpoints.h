// The checkpoints under checkpoint.upload (s3://bucket/prefix), laid out as on disk:
//   <prefix>/step_00001000/node_0000.h5 ... node_NNNN.h5
//   <prefix>/step_00001000/manifest.json   uploaded once every node file is there
//   <prefix>/latest                        the newest complete step, uploaded last
// The same commit rule as on disk: a step without manifest.json does not count, so S3's
// `latest` never names an incomplete checkpoint.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_format.h"
#include "config/config.h"
#include "storage/s3_client.h"
#include "storage/s3_endpoint.h"
#include "storage/s3_uri.h"

namespace trident {

class RemoteCheckpoints {
 public:
  // The store at `uri` with checkpoint.s3_*'s settings. UsageError without credentials.
  RemoteCheckpoints(const std::string& uri, const CheckpointConfig& c);

  const S3Uri& uri() const { return uri_; }
  S3Client& client() { return *client_; }
  std::string key(const std::string& step, const std::string& file) const { return uri_.key(step + "/" + file); }
  std::string describe() const;  // "s3://bucket/prefix (credentials: environment)"

  // The step `latest` names; nullopt if there is none.
  std::optional<std::string> latest();
  // The step folders, oldest first, and which of them hold a manifest.json.
  struct Step {
    std::string name;
    bool complete = false;
    uint64_t bytes = 0;  // of every object in it
  };
  std::vector<Step> steps();
  std::optional<std::string> manifest_text(const std::string& step);
  // A complete checkpoint's manifest, read from S3 (its node files go to `local_dir`).
  Manifest manifest(const std::string& step, const std::string& local_dir);
  // Where to resume: `latest` first, then the other complete steps, newest first.
  std::vector<std::string> resume_candidates();
  // After every node file is confirmed: manifest.json, then latest.
  void commit(const std::string& step, const std::string& manifest_text);
  // Among the steps up to `committed` (the one just committed; newer folders are left
  // alone): deletes the complete ones beyond the newest keep_last and the incomplete ones
  // (uploads that failed); returns the steps removed.
  std::vector<std::string> prune(int keep_last, const std::string& committed);
  // A node file into `path` (a temporary name beside it first), refused unless its size
  // and CRC-32 are the manifest's.
  S3Transfer download(const std::string& step, const ManifestFile& f, const std::string& path);

 private:
  S3Uri uri_;
  std::shared_ptr<AwsCredentialProvider> credentials_;
  std::unique_ptr<S3Client> client_;
};

}  // namespace trident
