// Training data in S3. Any data.path or data.val_path entry (a blend's too) may be
// s3://bucket/key: a Megatron prefix (its .bin and .idx), a glob of llm.c shards
// (s3://b/fineweb/*_train_*.bin), a text or JSONL file, or a folder. Before training each
// node's leader copies the objects it names into data.cache_dir/<bucket>/<key> (ranged
// GETs in parallel, the checkpoint client's retries), and the run reads that copy as it
// reads any local dataset. On a folder every node sees (a shared file system) the leaders
// share the files out, each fetched once.
//
// A copy is checked against S3: its size, and its MD5 where the ETag is one (an object
// put whole, without SSE-KMS); what a node already holds and checks out is kept, so a
// restarted job (a requeue, the next run on the same nodes) fetches only what changed.
// Rank 0 prints a progress line while copying (bytes, GB/s, ETA) and what it did.
// Training starts before a Megatron token file's copy is there (data.wait_for_copy false,
// the default): it reads the file with ranged GETs meanwhile (data/s3_stream.h).
// Bad input (no credentials, a missing bucket, a key that names nothing) is one error on
// every rank before training, exit 2.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/token_dataset.h"
#include "parallel/parallel_state.h"
#include "storage/s3_client.h"

namespace trident {

// Whether a data.path / val_path value names S3 anywhere (a blend's entries included).
bool names_s3(const std::string& data_path);

// The local copy of one s3://bucket/key entry under `cache_dir`: cache_dir/bucket/key
// (glob characters kept).
std::string local_copy_of(const std::string& uri, const std::string& cache_dir);

// The S3 settings of s3:// data: checkpoint.s3_*'s, with data.s3_endpoint where set (else
// checkpoint.s3_endpoint, else the environment's: storage/s3_endpoint.h).
S3Settings data_s3_settings(const Config& config);

// data.cache_dir, or its default: $SLURM_TMPDIR/trident-data, else /tmp/trident-data.
std::string data_cache_dir(const DataConfig& data);

// Records the file at local_copy_of(s3://bucket/key) as the copy of that object (its ETag
// and size as uploaded): `prepare --out s3://...` leaves what it uploaded where a run
// reading it keeps its copy, and that run need not fetch it again.
void remember_copy(const std::string& cache_dir, const std::string& bucket, const std::string& key,
                   const std::string& etag, uint64_t size);

// Collective. `config.data` with every s3:// entry of path and val_path replaced by its
// local copy, fetched first where missing or changed (S3 settings: data_s3_settings);
// under data.stream a Megatron prefix stays s3:// (data/s3_stream.h), opened by
// open_remote (open_training_data's) from what rank 0 listed.
// Unless data.wait_for_copy, a Megatron prefix's token file (the large part) is not waited
// for: the prefix stays s3:// too where this node lacks its copy, read with ranged GETs
// until the copy is complete and verified, then from it; `background` is the node leader's
// copy of those files (started here; on a thread at idle priority, as checkpoint uploads).
struct StagedData {
  DataConfig data;
  RemoteOpener open_remote;
  std::shared_ptr<DataInBackground> background;  // null on the other ranks, or with nothing to copy
};
// copy_while_reading false (a short read, as `eval`'s): the files that would be copied
// meanwhile are only streamed.
StagedData stage_s3_data(const Config& config, ParallelState& parallel, bool copy_while_reading = true);

// What `trident doctor` checks of the s3:// entries of data.path and val_path without
// copying any: each listed as stage_s3_data lists it (the same errors: a missing bucket, an
// entry that names nothing, a dataset's file or folder in place of its prefix); open_remote
// opens a Megatron prefix as data.stream does (its index read now, its tokens as asked).
// The other entries (llm.c shards, text, folders: train copies them first) are listed
// only, and named in `listed_only`. On one rank: not collective.
struct ListedData {
  RemoteOpener open_remote;
  std::vector<std::string> listed_only;
  size_t objects = 0;  // listed, every entry's
  double bytes = 0;
};
ListedData list_s3_data(const Config& config);

// What stage_s3_data's `background` does, for `objects` of `bucket` (as listed: ETag and
// size): once started, copies each into `cache_dir`, one after the other on a thread at
// idle priority, through a .partial file named by `writer` (host.pid), its MD5 checked;
// one whose copy is current there already (another leader's, on a shared folder) is
// skipped; one that fails is reported and left; cancelled when this goes first.
std::shared_ptr<DataInBackground> copy_in_background(const std::string& bucket, const std::vector<S3Object>& objects,
                                                     const std::string& cache_dir, const S3Settings& settings,
                                                     const std::string& writer, bool announce);

}  // namespace trident
