// Protocol Buffers' wire format, the part trident writes (TensorBoard's event files):
// varint, 64- and 32-bit fields, and length-delimited ones (strings, bytes, nested
// messages), each field a tag (number << 3 | wire type) then its value. The schema lives
// with the writer that uses it (monitor/tensorboard.cpp names TensorBoard's field numbers);
// the tests decode the files with the protobuf library itself.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace trident {

class ProtoWriter {
 public:
  ProtoWriter& varint_field(int field, uint64_t value) {
    tag(field, 0);
    varint(value);
    return *this;
  }
  ProtoWriter& double_field(int field, double value) {
    tag(field, 1);
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    for (int i = 0; i < 8; i++) out_.push_back(static_cast<char>(bits >> (8 * i)));
    return *this;
  }
  ProtoWriter& float_field(int field, float value) {
    tag(field, 5);
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    for (int i = 0; i < 4; i++) out_.push_back(static_cast<char>(bits >> (8 * i)));
    return *this;
  }
  ProtoWriter& bytes_field(int field, std::string_view value) {
    tag(field, 2);
    varint(value.size());
    out_.append(value);
    return *this;
  }
  ProtoWriter& message_field(int field, const ProtoWriter& message) { return bytes_field(field, message.bytes()); }
  const std::string& bytes() const { return out_; }

 private:
  void tag(int field, int wire_type) { varint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type)); }
  void varint(uint64_t value) {
    while (value >= 0x80) {
      out_.push_back(static_cast<char>(value | 0x80));
      value >>= 7;
    }
    out_.push_back(static_cast<char>(value));
  }
  std::string out_;
};

}  // namespace trident
