// data.stream: a Megatron dataset in S3 read as training needs it, instead of copied to
// the node first (data/s3_data.h). Opening it reads the index (<prefix>.idx, whole: the
// documents and where each sequence is) and the token file's size and ETag; then each
// batch's sequences are ranged GETs of exactly their bytes, a batch's fetched together
// (up to checkpoint.s3_parallel at once), every range with If-Match on the ETag (an object
// replaced meanwhile is an error, not a mix). What was fetched stays in a bounded cache,
// least recently used out first (the validation batches, the same at every evaluation,
// come from it). Every rank reads its own sequences: no copy on disk, no wait for one.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "data/token_dataset.h"
#include "storage/s3_client.h"

namespace trident {

// The Megatron dataset at s3://bucket/prefix: its .idx read now, its .bin (`bin`, as
// listed: key, size, ETag) as batches need it, `cache_bytes` of fetched ranges kept.
// UsageError when the index is not there.
std::unique_ptr<TokenDataset> open_streamed_megatron_dataset(const std::string& uri, const S3Object& bin,
                                                             const S3Settings& settings, size_t cache_bytes);

// The same while a copy of the prefix is being made at `local_prefix` (data.wait_for_copy
// false, data/s3_data.h): the index read from its copy (there already), the token file
// streamed as above until `copied()` says its copy is complete and verified (asked before
// each batch's reads), then read from the copy. `announce`: print when it switches (rank 0).
std::unique_ptr<TokenDataset> open_megatron_dataset_being_copied(const std::string& uri, const S3Object& bin,
                                                                 const S3Settings& settings, size_t cache_bytes,
                                                                 const std::string& local_prefix,
                                                                 std::function<bool()> copied, bool announce);

}  // namespace trident
