#include "monitor/tfrecord.h"

#include <boost/crc.hpp>
#include <cerrno>
#include <cstring>

#include "kernels/base/error.h"

namespace trident {

uint32_t masked_crc32c(std::string_view bytes) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(bytes.data(), bytes.size());
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TfRecordWriter::TfRecordWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "wb");
  require(file_ != nullptr, "cannot write the TensorBoard event file '" + path + "': " + std::strerror(errno) +
                                " (log.tensorboard_dir; 'none' turns TensorBoard off)");
}

TfRecordWriter::~TfRecordWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TfRecordWriter::write(std::string_view record) {
  char header[12];
  const uint64_t length = record.size();
  for (int i = 0; i < 8; i++) header[i] = static_cast<char>(length >> (8 * i));
  const uint32_t length_crc = masked_crc32c(std::string_view(header, 8));
  for (int i = 0; i < 4; i++) header[8 + i] = static_cast<char>(length_crc >> (8 * i));
  char footer[4];
  const uint32_t data_crc = masked_crc32c(record);
  for (int i = 0; i < 4; i++) footer[i] = static_cast<char>(data_crc >> (8 * i));
  const bool ok = std::fwrite(header, 1, sizeof header, file_) == sizeof header &&
                  std::fwrite(record.data(), 1, record.size(), file_) == record.size() &&
                  std::fwrite(footer, 1, sizeof footer, file_) == sizeof footer;
  require(ok, "writing the TensorBoard event file '" + path_ + "' failed: " + std::strerror(errno));
  bytes_ += sizeof header + record.size() + sizeof footer;
}

void TfRecordWriter::flush() {
  require(std::fflush(file_) == 0, "writing the TensorBoard event file '" + path_ + "' failed: " + std::strerror(errno));
}

}  // namespace trident
