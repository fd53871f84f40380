#include "pipeline/pipeline_runner.h"

#include <string>

#include "kernels/base/error.h"
#include "monitor/step_trace.h"
#include "pipeline/schedule.h"
#include "pipeline/transfer_tag.h"
#include "runtime/timer.h"

namespace trident {

PipelineRunner::PipelineRunner(std::vector<Transformer*> chunks, PipelineLinks links) : links_(links) {
  if (links_.pp != nullptr && links_.pp->size() == 1) links_.pp = nullptr;
  for (Transformer* model : chunks) chunks_.push_back({model, std::vector<RequestPtr>(model->slots()), nullptr});
}

void PipelineRunner::run_schedule(const int32_t* inputs, const int32_t* targets, int micro_batches,
                                  const Backward& backward_pass) {
  for (const Chunk& chunk : chunks_)
    check(chunk.model->slots() >= max_in_flight(links_.schedule, stage(), stages(), micro_batches),
          "the model has fewer activation slots than the schedule keeps in flight");
  compute_s_ = 0;
  for (const PipelineAction& action : stage_actions(links_.schedule, stage(), stages(), micro_batches)) {
    const int c = action.chunk, mb = action.micro_batch;
    check(c < static_cast<int>(chunks_.size()), "the schedule names a model chunk this rank does not hold");
    const Transformer& model = *chunks_[c].model;
    // Micro-batches leave in the order they came, never more than slots() at once: mb % slots is free.
    const int B = model.micro_batch(), slot = mb % model.slots();
    const size_t first = static_cast<size_t>(mb) * B * model.spec().seq_len;
    const trace::Span span("pipeline", [&] {
      return std::string(action.kind == PipelineAction::forward ? "forward" : "backward") + " mb " + std::to_string(mb);
    });
    compute_s_ += action.kind == PipelineAction::forward ? forward(c, mb, slot, inputs + first, targets + first, B)
                                                         : backward(c, mb, slot, backward_pass);
  }
  for (Chunk& chunk : chunks_) {
    for (RequestPtr& send : chunk.activation_sends) finish(send);
    finish(chunk.gradient_send);
  }
}

void PipelineRunner::forward_only(const int32_t* inputs, const int32_t* targets, int B) {
  for (int c = 0; c < static_cast<int>(chunks_.size()); c++) {
    forward(c, 0, 0, inputs, targets, B);
    finish(chunks_[c].activation_sends[0]);  // sent before returning: slot 0 is reused by the next call
  }
}

double PipelineRunner::forward(int c, int micro_batch, int slot, const int32_t* inputs, const int32_t* targets,
                               int B) {
  Chunk& chunk = chunks_[c];
  Transformer& model = *chunk.model;
  const int chunks = static_cast<int>(chunks_.size());
  finish(chunk.activation_sends[slot]);  // the slot's last output must have left before we overwrite it
  if (!model.first_stage())
    links_.pp->recv(model.stage_input(slot, B), upstream(c).stage,
                    transfer_tag(Transfer::activation, micro_batch, c, chunks));
  Timer computing;
  model.forward(slot, inputs, targets, B);
  const double seconds = computing.seconds();
  if (!model.last_stage()) {
    const Place to = downstream(c);
    const int tag = transfer_tag(Transfer::activation, micro_batch, to.chunk, chunks);
    chunk.activation_sends[slot] = links_.pp->send_async(model.stage_output(slot, B), to.stage, tag);
  }
  return seconds;
}

double PipelineRunner::backward(int c, int micro_batch, int slot, const Backward& backward_pass) {
  Chunk& chunk = chunks_[c];
  Transformer& model = *chunk.model;
  const int chunks = static_cast<int>(chunks_.size()), B = model.micro_batch();
  finish(chunk.gradient_send);  // backward rewrites stage_gradient(): the last one sent must have left
  if (!model.last_stage())
    links_.pp->recv(model.stage_gradient(B), downstream(c).stage,
                    transfer_tag(Transfer::gradient, micro_batch, c, chunks));
  Timer computing;
  backward_pass(model, slot);
  const double seconds = computing.seconds();
  if (!model.first_stage()) {
    const Place to = upstream(c);
    const int tag = transfer_tag(Transfer::gradient, micro_batch, to.chunk, chunks);
    chunk.gradient_send = links_.pp->send_async(model.stage_gradient(B), to.stage, tag);
  }
  return seconds;
}

}  // namespace trident
