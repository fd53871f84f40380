// checkpoint.s3_* as the S3 client's settings: what checkpoints (ckpt/remote_checkpoints.h)
// and s3:// data (data/s3_data.h) both use, so it stands below both of them.
#pragma once

#include "config/config.h"
#include "storage/s3_client.h"
#include "storage/s3_endpoint.h"

namespace trident {

// checkpoint.s3_* as the client's settings; the region resolved as AWS's tools would
// (else us-east-1) and checked; the endpoint `endpoint` (default: checkpoint.s3_endpoint,
// else the environment's: storage/s3_endpoint.h).
S3Settings s3_settings(const CheckpointConfig& c);
S3Settings s3_settings(const CheckpointConfig& c, const S3Endpoint& endpoint);

}  // namespace trident
