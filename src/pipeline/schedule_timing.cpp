#include "pipeline/schedule_timing.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "pipeline/transfer_tag.h"

namespace trident {

namespace {

// A transfer: its direction, micro-batch, and the virtual stage that receives it.
using Key = std::tuple<Transfer, int, int>;

struct Sent {
  double at = 0;              // when it left (the sender's pass ended)
  double received = -1;       // when the receiver's pass took it (-1: not yet)
};

}  // namespace

ScheduleTiming play_schedule(Schedule schedule, int stages, int micro_batches, int chunks, const PassTimes& times) {
  const int p = stages, V = chunks, last_virtual = p * V - 1;
  ScheduleTiming result;
  std::vector<std::vector<PipelineAction>> actions(p);
  std::vector<ActivationSlots> slots(p);  // as the runner keeps them (pipeline/pipeline_runner.h)
  for (int s = 0; s < p; s++) {
    actions[s] = stage_actions(schedule, s, p, micro_batches, V);
    slots[s] = activation_slots(actions[s], V);
  }
  std::map<Key, Sent> sent;
  // Per stage: the activation sends of each slot and the last gradient send, not yet seen gone.
  std::vector<std::vector<std::vector<Key>>> slot_sends(p);
  std::vector<std::vector<Key>> gradient_send(p);
  for (int s = 0; s < p; s++) slot_sends[s].resize(slots[s].slots);
  // Per (from, to, direction): the tags in sending order, and in receiving order.
  std::map<std::tuple<int, int, Transfer>, std::vector<int>> send_order, receive_order;
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0.0);
  result.busy.assign(p, 0.0);
  const double backward_time = times.input_gradient + times.weight_gradient;
  const bool split = schedule == Schedule::zb1;
  size_t remaining = 0;
  for (const auto& a : actions) remaining += a.size();
  // A backward whose gradient was received but whose own last send has not yet been
  // taken: it has computed (from `computed_at`) and waits to send.
  std::vector<double> computed_at(p, -1);
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < p; s++) {
      while (next[s] < actions[s].size()) {
        const PipelineAction& a = actions[s][next[s]];
        const int v = a.chunk * p + s, slot = slots[s].slot[next[s]];
        const bool forward = a.kind == PipelineAction::forward, weight = a.kind == PipelineAction::weight_gradient;
        const double cost = forward  ? times.forward / V
                            : weight ? times.weight_gradient / V
                                     : (a.kind == PipelineAction::backward || !split ? backward_time : times.input_gradient) / V;
        const bool sends = forward ? v < last_virtual : !weight && v > 0;
        if (computed_at[s] < 0) {
          double start = clock[s];
          // A forward first sees its slot's last outputs gone (it receives into the slot).
          if (forward) {
            bool gone = true;
            for (const Key& k : slot_sends[s][slot]) {
              if (sent.at(k).received < 0) gone = false;
              else start = std::max(start, sent.at(k).received);
            }
            if (!gone) break;
          }
          std::optional<Key> input;
          if (forward && v > 0) input = Key{Transfer::activation, a.micro_batch, v};
          if (!forward && !weight && v < last_virtual) input = Key{Transfer::gradient, a.micro_batch, v};
          if (input) {
            const auto it = sent.find(*input);
            if (it == sent.end()) break;  // not sent yet
            start = std::max(start, it->second.at);
            it->second.received = start;
            const auto [direction, mb, to] = *input;
            const int from = direction == Transfer::activation ? (to - 1) % p : (to + 1) % p;
            receive_order[{from, s, direction}].push_back(transfer_tag(direction, mb, to / p, V));
          }
          if (forward) slot_sends[s][slot].clear();
          computed_at[s] = start + cost;
          result.busy[s] += cost;
          progressed = true;
        }
        double end = computed_at[s];
        // A backward sends from a copy that its last send must have left.
        if (!forward && !weight && sends) {
          bool gone = true;
          for (const Key& k : gradient_send[s]) {
            if (sent.at(k).received < 0) gone = false;
            else end = std::max(end, sent.at(k).received);
          }
          if (!gone) break;
        }
        clock[s] = end;
        computed_at[s] = -1;
        if (forward && sends) {
          const Key k{Transfer::activation, a.micro_batch, v + 1};
          sent[k] = {end, -1};
          slot_sends[s][slot].push_back(k);
          send_order[{s, (v + 1) % p, Transfer::activation}].push_back(
              transfer_tag(Transfer::activation, a.micro_batch, (v + 1) / p, V));
        } else if (!forward && sends) {
          const Key k{Transfer::gradient, a.micro_batch, v - 1};
          sent[k] = {end, -1};
          gradient_send[s] = {k};
          send_order[{s, (v - 1) % p, Transfer::gradient}].push_back(
              transfer_tag(Transfer::gradient, a.micro_batch, (v - 1) / p, V));
        }
        next[s]++;
        remaining--;
        progressed = true;
      }
    }
    if (!progressed) {
      for (int s = 0; s < p; s++)
        if (next[s] < actions[s].size()) {
          const PipelineAction& a = actions[s][next[s]];
          result.stuck = "stage " + std::to_string(s) + " at " + action_name(a.kind) + " mb " +
                         std::to_string(a.micro_batch) + " chunk " + std::to_string(a.chunk);
          break;
        }
      return result;
    }
  }
  result.completes = true;
  result.step = *std::max_element(clock.begin(), clock.end());
  result.transfers_in_order = send_order == receive_order;
  return result;
}

}  // namespace trident
