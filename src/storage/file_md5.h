// A file's MD5, as S3's ETag of an object put whole holds it: a copy made from S3 is
// checked against it (data/s3_data.h).
#pragma once

#include <functional>
#include <string>

namespace trident {

// The MD5 of the file at `path`, in lower-case hex, read in blocks of 8 MiB. `stop`, asked
// before each block, ends it early (a copy cancelled while its MD5 is taken): an
// InfrastructureError then, nothing more read.
std::string file_md5(const std::string& path, const std::function<bool()>& stop = {});

}  // namespace trident
