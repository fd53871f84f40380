#include "pipeline/pipeline_runner.h"

#include <string>

#include "kernels/base/error.h"
#include "monitor/step_trace.h"
#include "pipeline/schedule.h"
#include "pipeline/transfer_tag.h"
#include "runtime/timer.h"

namespace trident {

PipelineRunner::PipelineRunner(Transformer& model, PipelineLinks links) : model_(model), links_(links) {
  if (links_.pp != nullptr && links_.pp->size() == 1) links_.pp = nullptr;
  activation_sends_.resize(model.slots());
}

void PipelineRunner::run_schedule(const int32_t* inputs, const int32_t* targets, int micro_batches,
                                  const Backward& backward_pass) {
  const std::vector<PipelineAction> actions = stage_actions(links_.schedule, stage(), stages(), micro_batches, chunks());
  const ActivationSlots slots = activation_slots(actions, chunks());
  check(model_.slots() >= slots.slots, "the model has fewer activation slots than the schedule keeps in flight");
  for (int c = 0; c < chunks(); c++)
    check(model_.chunk_slots(c) >= slots.chunk_slots[c],
          "the model has fewer slots for chunk " + std::to_string(c) + "'s own activations than the schedule keeps");
  pass_s_ = {};
  for (size_t i = 0; i < actions.size(); i++) {
    const PipelineAction& action = actions[i];
    const int c = action.chunk, mb = action.micro_batch;
    check(c < chunks(), "the schedule names a model chunk this rank does not hold");
    const int B = model_.micro_batch(), slot = slots.slot[i];
    const size_t first = static_cast<size_t>(mb) * B * model_.spec().seq_len;
    const trace::Span span("pipeline", [&] {
      return std::string(action_name(action.kind)) + " mb " + std::to_string(mb) +
             (chunks() > 1 ? " chunk " + std::to_string(c) : "");
    });
    switch (action.kind) {
      case PipelineAction::forward:
        pass_s_.forward += forward(c, mb, slot, slots.chunk_slot[i], inputs + first, targets + first, B);
        break;
      case PipelineAction::backward:
        pass_s_.input_gradient += backward(c, mb, slot, BackwardPart::whole, backward_pass);
        break;
      case PipelineAction::input_gradient:
        pass_s_.input_gradient += backward(c, mb, slot, BackwardPart::input, backward_pass);
        break;
      case PipelineAction::weight_gradient: {
        Timer computing;  // no transfer: the input half sent the gradient
        backward_pass(c, slot, BackwardPart::weight);
        pass_s_.weight_gradient += computing.seconds();
        break;
      }
    }
  }
  compute_s_ = pass_s_.forward + pass_s_.input_gradient + pass_s_.weight_gradient;
  for (RequestPtr& send : activation_sends_) finish(send);
  finish(gradient_send_);
}

void PipelineRunner::forward_only(const int32_t* inputs, const int32_t* targets, int B) {
  for (int c = 0; c < chunks(); c++) forward(c, 0, 0, 0, inputs, targets, B);
  finish(activation_sends_[0]);  // sent before returning: slot 0 is reused by the next call
}

double PipelineRunner::forward(int c, int micro_batch, int slot, int chunk_slot, const int32_t* inputs,
                               const int32_t* targets, int B) {
  finish(activation_sends_[slot]);  // the slot's last output must have left before we overwrite it
  if (!model_.embeds(c))
    links_.pp->recv(model_.stage_input(c, slot, B), upstream(c).stage,
                    transfer_tag(Transfer::activation, micro_batch, c, chunks()));
  Timer computing;
  model_.chunk_forward(c, slot, inputs, targets, B, chunk_slot);
  const double seconds = computing.seconds();
  if (!model_.has_head(c)) {
    const Place to = downstream(c);
    const int tag = transfer_tag(Transfer::activation, micro_batch, to.chunk, chunks());
    activation_sends_[slot] = links_.pp->send_async(model_.stage_output(c, slot, B), to.stage, tag);
  }
  return seconds;
}

double PipelineRunner::backward(int c, int micro_batch, int slot, BackwardPart part, const Backward& backward_pass) {
  const int B = model_.micro_batch();
  // Received before this rank waits on its own last send (sent from a copy): two stages
  // each waiting for the other to take its last gradient before posting their next
  // receive would wait for ever (pipeline/schedule_timing.h plays this out).
  if (!model_.has_head(c))
    links_.pp->recv(model_.stage_gradient(B), downstream(c).stage,
                    transfer_tag(Transfer::gradient, micro_batch, c, chunks()));
  Timer computing;
  backward_pass(c, slot, part);
  const double seconds = computing.seconds();
  if (!model_.embeds(c)) {
    const Place to = upstream(c);
    const int tag = transfer_tag(Transfer::gradient, micro_batch, to.chunk, chunks());
    finish(gradient_send_);  // its copy is about to be overwritten
    gradient_send_ = links_.pp->send_async(model_.gradient_to_send(B), to.stage, tag);
  }
  return seconds;
}

}  // namespace trident
