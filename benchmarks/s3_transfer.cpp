// One file up to S3 and back through trident's S3 client, as a checkpoint's node file
// goes (multipart, parts in parallel, SHA-256-signed bodies, CRC-32 of the bytes; ranged
// GETs in parallel on the way back), timed; benchmarks/s3_checkpoint.sh sets it beside
// `aws s3 cp` of the same file to the same server.
//
//   s3_transfer --endpoint URL --bucket NAME --file PATH [--part-mb 64] [--parallel 8] [--rounds 3]
//
// Credentials as trident finds them (AWS_ACCESS_KEY_ID, ...). Prints one line per
// transfer: "upload|download SECONDS s GBPS GB/s PARTS parts REQUESTS requests".
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "storage/s3_client.h"

using namespace trident;

int main(int argc, char** argv) {
  std::string endpoint, bucket, file;
  int part_mb = 64, parallel = 8, rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--endpoint") endpoint = value;
    else if (flag == "--bucket") bucket = value;
    else if (flag == "--file") file = value;
    else if (flag == "--part-mb") part_mb = std::atoi(value.c_str());
    else if (flag == "--parallel") parallel = std::atoi(value.c_str());
    else if (flag == "--rounds") rounds = std::atoi(value.c_str());
    else {
      std::fprintf(stderr, "s3_transfer: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (endpoint.empty() || bucket.empty() || file.empty()) {
    std::fprintf(stderr, "usage: s3_transfer --endpoint URL --bucket NAME --file PATH [--part-mb N] [--parallel N] [--rounds N]\n");
    return 2;
  }
  try {
    S3Settings s;
    s.endpoint = endpoint;
    s.region = "us-east-1";
    s.part_bytes = static_cast<size_t>(part_mb) << 20;
    s.parallel = parallel;
    S3Client client(bucket, s, std::make_shared<AwsCredentialProvider>());
    const std::string name = "s3_transfer/" + std::filesystem::path(file).filename().string();
    const std::string back = file + ".back";
    const auto requests = [&] {
      const S3Counts& c = client.counts();
      return c.put + c.get + c.head + c.list + c.post + c.del;
    };
    for (int r = 0; r < rounds; r++) {
      const std::string key = name + "." + std::to_string(r);  // a new object each round, as each checkpoint is
      uint64_t before = requests();
      const S3Transfer up = client.upload_file(file, key);
      std::printf("upload %.3f s %.3f GB/s %d parts %llu requests\n", up.seconds, up.bytes / up.seconds / 1e9, up.parts,
                  static_cast<unsigned long long>(requests() - before));
      before = requests();
      const S3Transfer down = client.download_file(key, up.bytes, back);
      std::printf("download %.3f s %.3f GB/s %d parts %llu requests\n", down.seconds, down.bytes / down.seconds / 1e9,
                  down.parts, static_cast<unsigned long long>(requests() - before));
      std::fflush(stdout);
      if (down.crc32 != up.crc32) {
        std::fprintf(stderr, "s3_transfer: the download's CRC-32 %08x is not the upload's %08x\n", down.crc32, up.crc32);
        return 1;
      }
      client.delete_object(key);
    }
    std::filesystem::remove(back);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "s3_transfer: %s\n", e.what());
    return 1;
  }
  return 0;
}
