// TensorBoard event files, written by rank 0 as TensorBoard's own writer writes them:
// <dir>/events.out.tfevents.<seconds>.<host>.<pid>.<n>, TFRecord framing (monitor/
// tfrecord.h), an Event protocol buffer per record (TensorBoard's event.proto and
// summary.proto, field numbers in tensorboard.cpp), the first the file-version event
// "brain.Event:2". Scalars are Summary values (simple_value), as PyTorch's SummaryWriter
// writes them for Megatron-LM; text goes to TensorBoard's text plugin. Every run opens a
// new file and first writes SessionLog START at its first step, which tells TensorBoard to
// drop what older files of the folder hold from that step on: a resumed run's curves go
// on from its checkpoint, a fresh run in the same folder starts them anew.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "monitor/run_metrics.h"
#include "monitor/tfrecord.h"

namespace trident {

class TensorBoardWriter {
 public:
  // first_step: the first step this run trains, from 1 (0: no SessionLog START).
  // UsageError naming the folder when it cannot be written.
  TensorBoardWriter(const std::string& dir, int64_t first_step = 0);
  // One event of several scalars at `step` (Megatron's step: the optimizer step, from 1).
  void scalars(const std::vector<MetricValue>& values, int64_t step);
  void scalar(const std::string& tag, double value, int64_t step);
  // Markdown shown by TensorBoard's text plugin (the resolved config, once).
  void text(const std::string& tag, const std::string& markdown, int64_t step);
  void flush() { records_.flush(); }
  // The run went back to an earlier step: TensorBoard drops this file's events from `step` on.
  void start_again_at(int64_t step);
  const std::string& path() const { return records_.path(); }
  uint64_t bytes_written() const { return records_.bytes_written(); }

 private:
  void write_summary(const std::string& summary, int64_t step);
  TfRecordWriter records_;
};

// events.out.tfevents.<seconds, 10 digits>.<host>.<pid>.<n> (TensorBoard's EventFileWriter).
std::string event_file_name(double wall_time, const std::string& host, long pid, int n);

}  // namespace trident
