#include "monitor/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "monitor/protobuf_wire.h"
#include "kernels/base/error.h"
#include "runtime/wall_clock.h"

namespace trident {

namespace {

// TensorBoard's field numbers (tensorboard/compat/proto/*.proto).
namespace event {  // message Event
constexpr int kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7;
}
namespace session_log {  // message SessionLog
constexpr int kStatus = 1, kStart = 1;
}
namespace summary {  // message Summary { repeated Value value = 1; }
constexpr int kValue = 1;
}
namespace value {  // message Summary.Value
constexpr int kTag = 1, kSimpleValue = 2, kTensor = 8, kMetadata = 9;
}
namespace metadata {  // message SummaryMetadata, and its PluginData
constexpr int kPluginData = 1, kDataClass = 4, kPluginName = 1, kTensorClass = 2;
}
namespace tensor {  // message TensorProto, with DataType DT_STRING (types.proto)
constexpr int kDtype = 1, kShape = 2, kStringVal = 8, kDtString = 7;
}

// The events of a process are numbered from 0, as TensorBoard's global uid is.
int next_file_number() {
  static int n = 0;
  return n++;
}

std::string host_name() {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  return host;
}

std::string file_in(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  require(!ec && std::filesystem::is_directory(dir),
          "cannot make the TensorBoard folder '" + dir + "' (log.tensorboard_dir; 'none' turns TensorBoard off)" +
              (ec ? ": " + ec.message() : ""));
  return (std::filesystem::path(dir) / event_file_name(unix_seconds(), host_name(), getpid(), next_file_number())).string();
}

ProtoWriter event_at(int64_t step) {
  ProtoWriter e;
  e.double_field(event::kWallTime, unix_seconds());
  if (step != 0) e.varint_field(event::kStep, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

std::string event_file_name(double wall_time, const std::string& host, long pid, int n) {
  char name[512];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%ld.%d", static_cast<long long>(wall_time),
                host.c_str(), pid, n);
  return name;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step) : records_(file_in(dir)) {
  ProtoWriter version = event_at(0);
  version.bytes_field(event::kFileVersion, "brain.Event:2");
  records_.write(version.bytes());
  if (first_step > 0) start_again_at(first_step);
  records_.flush();
}

void TensorBoardWriter::start_again_at(int64_t step) {
  ProtoWriter start = event_at(step);
  start.message_field(event::kSessionLog, ProtoWriter().varint_field(session_log::kStatus, session_log::kStart));
  records_.write(start.bytes());
  records_.flush();
}

void TensorBoardWriter::write_summary(const std::string& summary, int64_t step) {
  ProtoWriter e = event_at(step);
  e.bytes_field(event::kSummary, summary);
  records_.write(e.bytes());
}

void TensorBoardWriter::scalars(const std::vector<MetricValue>& values, int64_t step) {
  ProtoWriter s;
  for (const auto& [metric, number] : values) {
    if (metric->tensorboard[0] == '\0') continue;  // the step itself
    ProtoWriter v;
    v.bytes_field(value::kTag, metric->tensorboard).float_field(value::kSimpleValue, static_cast<float>(number));
    s.message_field(summary::kValue, v);
  }
  write_summary(s.bytes(), step);
}

void TensorBoardWriter::scalar(const std::string& tag, double number, int64_t step) {
  ProtoWriter v;
  v.bytes_field(value::kTag, tag).float_field(value::kSimpleValue, static_cast<float>(number));
  write_summary(ProtoWriter().message_field(summary::kValue, v).bytes(), step);
}

void TensorBoardWriter::text(const std::string& tag, const std::string& markdown, int64_t step) {
  // As TensorBoard's text summary: a string scalar tensor, for the "text" plugin.
  ProtoWriter plugin;
  plugin.bytes_field(metadata::kPluginName, "text");
  ProtoWriter meta;
  meta.message_field(metadata::kPluginData, plugin).varint_field(metadata::kDataClass, metadata::kTensorClass);
  ProtoWriter t;
  t.varint_field(tensor::kDtype, tensor::kDtString).message_field(tensor::kShape, ProtoWriter()).bytes_field(
      tensor::kStringVal, markdown);
  ProtoWriter v;
  v.bytes_field(value::kTag, tag).message_field(value::kMetadata, meta).message_field(value::kTensor, t);
  write_summary(ProtoWriter().message_field(summary::kValue, v).bytes(), step);
}

}  // namespace trident
