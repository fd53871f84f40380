// Pipeline schedules as pure arithmetic: which micro-batch (and model chunk) each stage
// runs at each tick, against the closed forms of 1F1B, GPipe, interleaved 1F1B and ZB-H1
// (every shape up to p 8, V 4, m 32 played out: no deadlock, transfers in one order on
// both sides, the bubbles of the papers), the stage layer split, and the tags of the
// transfers between stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "pipeline/schedule.h"
#include "pipeline/schedule_timing.h"
#include "pipeline/transfer_tag.h"
#include "kernels/base/error.h"

namespace trident {
namespace {

using A = PipelineAction;

TEST(Schedule, OneFOneBOnFourStagesAndSixMicroBatches) {
  // Stage 0: warmup p-s-1 = 3 forwards, steady (F, B) x 3, cooldown 3 backwards.
  EXPECT_EQ(stage_actions(Schedule::one_f_one_b, 0, 4, 6),
            (std::vector<A>{{A::forward, 0}, {A::forward, 1}, {A::forward, 2}, {A::forward, 3}, {A::backward, 0},
                            {A::forward, 4}, {A::backward, 1}, {A::forward, 5}, {A::backward, 2}, {A::backward, 3},
                            {A::backward, 4}, {A::backward, 5}}));
  // The last stage has no warmup: forward, backward, forward, backward, ...
  EXPECT_EQ(stage_actions(Schedule::one_f_one_b, 3, 4, 3),
            (std::vector<A>{{A::forward, 0}, {A::backward, 0}, {A::forward, 1}, {A::backward, 1}, {A::forward, 2},
                            {A::backward, 2}}));
  // Fewer micro-batches than stages: the warmup is cut to m.
  EXPECT_EQ(stage_actions(Schedule::one_f_one_b, 0, 4, 2),
            (std::vector<A>{{A::forward, 0}, {A::forward, 1}, {A::backward, 0}, {A::backward, 1}}));
}

TEST(Schedule, ClosedFormsForEveryShape) {
  for (int p = 1; p <= 6; p++)
    for (int m = 1; m <= 9; m++)
      for (int s = 0; s < p; s++) {
        for (Schedule schedule : {Schedule::one_f_one_b, Schedule::gpipe}) {
          const std::vector<A> actions = stage_actions(schedule, s, p, m);
          ASSERT_EQ(actions.size(), 2u * m);
          // Forwards and backwards each run 0..m-1 in order (GPipe: backwards reversed).
          std::vector<int> forwards, backwards;
          int live = 0, most_live = 0;
          for (const A& a : actions) {
            ASSERT_EQ(a.chunk, 0);  // one model chunk per rank
            (a.kind == A::forward ? forwards : backwards).push_back(a.micro_batch);
            live += a.kind == A::forward ? 1 : -1;
            most_live = std::max(most_live, live);
            // A micro-batch goes backward only after its forward.
            if (a.kind == A::backward) {
              ASSERT_NE(std::find(forwards.begin(), forwards.end(), a.micro_batch), forwards.end());
            }
          }
          for (int i = 0; i < m; i++) {
            ASSERT_EQ(forwards[i], i);
            ASSERT_EQ(backwards[i], schedule == Schedule::gpipe ? m - 1 - i : i);
          }
          ASSERT_EQ(most_live, max_in_flight(schedule, s, p, m));
          if (schedule == Schedule::one_f_one_b) {
            // Closed form: the k-th backward (k >= 0) comes right after forward
            // min(k + p - s - 1, m - 1), i.e. at position min(k + w, m - 1) + k + 1.
            const int w = std::min(p - s - 1, m);
            for (int k = 0; k < m; k++) {
              const int position = (k < m - w ? k + w + k + 1 : m + k);
              ASSERT_EQ(actions[position], (A{A::backward, k})) << "p " << p << " m " << m << " s " << s;
            }
            ASSERT_EQ(most_live, std::min(p - s, m));
          }
        }
      }
}

// Most micro-batches alive at once on a stage, counted from the actions: from a
// micro-batch's first pass to its last on the rank.
// The most (micro-batch, chunk) pairs alive at once (from the first action to the last),
// of one chunk if `chunk` >= 0.
int alive_at_most(const std::vector<A>& actions, int chunk = -1) {
  std::map<std::pair<int, int>, int> first, last;
  for (int i = 0; i < static_cast<int>(actions.size()); i++) {
    if (chunk >= 0 && actions[i].chunk != chunk) continue;
    first.try_emplace({actions[i].micro_batch, actions[i].chunk}, i);
    last[{actions[i].micro_batch, actions[i].chunk}] = i;
  }
  int most = 0;
  for (int i = 0; i < static_cast<int>(actions.size()); i++) {
    int alive = 0;
    for (const auto& [pair, f] : first) alive += f <= i && i <= last[pair];
    most = std::max(most, alive);
  }
  return most;
}

// No two pairs alive at once share a slot (of the pool, or of their chunk's own), each
// pair keeps its slots from its first action to its last, and the slots are as few as
// the pairs alive at once.
void expect_slots_hold(const std::vector<A>& actions, int chunks, const std::string& shape) {
  const ActivationSlots s = activation_slots(actions, chunks);
  ASSERT_EQ(s.slots, alive_at_most(actions)) << shape;
  std::map<std::pair<int, int>, std::pair<int, int>> slots_of, span;  // pair -> its slots, its first and last
  for (int i = 0; i < static_cast<int>(actions.size()); i++) {
    const std::pair<int, int> pair{actions[i].micro_batch, actions[i].chunk};
    const auto [it, first] = slots_of.try_emplace(pair, s.slot[i], s.chunk_slot[i]);
    ASSERT_EQ(it->second, std::make_pair(s.slot[i], s.chunk_slot[i])) << shape;
    if (first) span[pair].first = i;
    span[pair].second = i;
  }
  for (int c = 0; c < chunks; c++) ASSERT_EQ(s.chunk_slots[c], alive_at_most(actions, c)) << shape;
  for (const auto& [a, a_span] : span)
    for (const auto& [b, b_span] : span) {
      if (a >= b || a_span.second < b_span.first || b_span.second < a_span.first) continue;  // not alive together
      ASSERT_NE(slots_of[a].first, slots_of[b].first) << shape;
      if (a.second == b.second) {
        ASSERT_NE(slots_of[a].second, slots_of[b].second) << shape;
      }
    }
}

TEST(Schedule, InterleavedIsMegatronsOrder) {
  // p 2, V 2, m 4 on stage 0: warmup (p-s-1)*2 + (V-1)*p = 4 forwards: mb 0, 1 of chunk 0,
  // then mb 0, 1 of chunk 1; then 1F1B over (micro-batch, chunk) pairs, backwards from the
  // last chunk.
  EXPECT_EQ(stage_actions(Schedule::interleaved, 0, 2, 4, 2),
            (std::vector<A>{{A::forward, 0, 0}, {A::forward, 1, 0}, {A::forward, 0, 1}, {A::forward, 1, 1},
                            {A::forward, 2, 0}, {A::backward, 0, 1}, {A::forward, 3, 0}, {A::backward, 1, 1},
                            {A::forward, 2, 1}, {A::backward, 0, 0}, {A::forward, 3, 1}, {A::backward, 1, 0},
                            {A::backward, 2, 1}, {A::backward, 3, 1}, {A::backward, 2, 0}, {A::backward, 3, 0}}));
  // Kept per (micro-batch, chunk), as Megatron keeps them: stage s holds its warmup's pairs
  // and one more, each 1/V of its layers (stage 0 at p 2, V 2: 5 halves, 1.25x 1F1B's 2
  // micro-batches); the embedding's chunk (0) at most 4 micro-batches, the head's one.
  for (const auto& [p, V] : {std::pair{2, 2}, {4, 2}, {2, 4}, {4, 4}, {8, 2}})
    for (int s = 0; s < p; s++)
      EXPECT_EQ(max_in_flight(Schedule::interleaved, s, p, 4 * p, V), (p - s - 1) * 2 + (V - 1) * p + 1)
          << p << " " << V << " " << s;
  EXPECT_EQ(activation_slots(Schedule::interleaved, 0, 2, 8, 2).chunk_slots, (std::vector<int>{4, 2}));
  EXPECT_EQ(activation_slots(Schedule::interleaved, 1, 2, 8, 2).chunk_slots, (std::vector<int>{3, 1}));
}

TEST(Schedule, ZeroBubbleH1DefersWeightGradientsWithinPMicroBatches) {
  // The last of 2 stages keeps one weight-gradient pass waiting; the first none.
  EXPECT_EQ(stage_actions(Schedule::zb1, 1, 2, 3),
            (std::vector<A>{{A::forward, 0}, {A::input_gradient, 0}, {A::forward, 1}, {A::input_gradient, 1},
                            {A::weight_gradient, 0}, {A::forward, 2}, {A::input_gradient, 2}, {A::weight_gradient, 1},
                            {A::weight_gradient, 2}}));
  EXPECT_EQ(stage_actions(Schedule::zb1, 0, 2, 3),
            (std::vector<A>{{A::forward, 0}, {A::forward, 1}, {A::input_gradient, 0}, {A::weight_gradient, 0},
                            {A::forward, 2}, {A::input_gradient, 1}, {A::weight_gradient, 1}, {A::input_gradient, 2},
                            {A::weight_gradient, 2}}));
}

// Every shape up to p 8, V 4, m 32, played out as the runner executes it: each pass once
// and in a legal order, no stage waiting for ever, every pair of stages sending and
// receiving in one order, the slots the schedule claims, and the bubble on stage 0 of
// each paper's closed form (pass times F, B, W per micro-batch and stage).
TEST(Schedule, EveryShapePlaysOutWithItsClosedFormBubble) {
  const std::vector<PassTimes> costs = {{1, 1, 1}, {1, 1.3, 0.7}, {1, 1, 0.5}, {1, 2, 2}, {1, 0.8, 1.1}};
  int shapes = 0;
  for (int p = 1; p <= 8; p++)
    for (int m = 1; m <= 32; m++)
      for (Schedule schedule : {Schedule::one_f_one_b, Schedule::gpipe, Schedule::interleaved, Schedule::zb1})
        for (int V = 1; V <= (schedule == Schedule::interleaved ? 4 : 1); V++) {
          if (schedule == Schedule::interleaved && (p < 2 || V < 2 || m % p != 0)) continue;
          shapes++;
          const std::string shape = std::string(name_of(schedule)) + " p " + std::to_string(p) + " m " +
                                    std::to_string(m) + " V " + std::to_string(V);
          for (int s = 0; s < p; s++) {
            const std::vector<A> actions = stage_actions(schedule, s, p, m, V);
            // Each (micro-batch, chunk) passes forward, then backward (zb1: input, then weight) once.
            std::map<std::tuple<int, int, int>, int> at;  // (kind, mb, chunk) -> position
            for (int i = 0; i < static_cast<int>(actions.size()); i++)
              ASSERT_TRUE(at.emplace(std::make_tuple(int(actions[i].kind), actions[i].micro_batch, actions[i].chunk), i).second)
                  << shape;
            const bool split = schedule == Schedule::zb1;
            ASSERT_EQ(actions.size(), static_cast<size_t>(m * V * (split ? 3 : 2))) << shape;
            for (int mb = 0; mb < m; mb++)
              for (int c = 0; c < V; c++) {
                const int f = at.at({A::forward, mb, c});
                const int b = at.at({split ? A::input_gradient : A::backward, mb, c});
                ASSERT_LT(f, b) << shape;
                if (split) {
                  ASSERT_LT(b, at.at({A::weight_gradient, mb, c})) << shape;
                }
              }
            const int alive = alive_at_most(actions);
            ASSERT_EQ(max_in_flight(schedule, s, p, m, V), alive) << shape << " stage " << s;
            expect_slots_hold(actions, V, shape + " stage " + std::to_string(s));
            if (schedule == Schedule::zb1) {
              ASSERT_LE(alive, std::min(p, m)) << shape;  // 1F1B's peak, stage 0's
            }
          }
          for (const PassTimes& t : costs) {
            const ScheduleTiming timing = play_schedule(schedule, p, m, V, t);
            ASSERT_TRUE(timing.completes) << shape << ": stuck at " << timing.stuck;
            ASSERT_TRUE(timing.transfers_in_order) << shape;
            if (m < p) continue;  // the closed forms are for full pipelines
            const double F = t.forward, B = t.input_gradient, W = t.weight_gradient;
            double expected = (p - 1) * (F + B + W);  // 1F1B and GPipe
            if (schedule == Schedule::interleaved) expected /= V;
            if (schedule == Schedule::zb1) expected = (p - 1) * std::max({F, B, F + B - W});
            ASSERT_NEAR(timing.bubble(0), expected, 1e-9) << shape << " F " << F << " B " << B << " W " << W;
            ASSERT_NEAR(timing.step, timing.busy[0] + expected, 1e-9) << shape;
          }
        }
  EXPECT_EQ(shapes, 3 * 8 * 32 + 3 * (16 + 10 + 8 + 6 + 5 + 4 + 4));  // interleaved: m a multiple of p
}

TEST(Schedule, TransferTagsAreDistinctPerChunkMicroBatchAndDirection) {
  // One chunk per rank: 2 mb for an activation, 2 mb + 1 for a gradient.
  EXPECT_EQ(transfer_tag(Transfer::activation, 5, 0, 1), 10);
  EXPECT_EQ(transfer_tag(Transfer::gradient, 5, 0, 1), 11);
  for (int chunks = 1; chunks <= 4; chunks++) {
    std::set<int> tags;
    const int m = 16;
    for (int mb = 0; mb < m; mb++)
      for (int chunk = 0; chunk < chunks; chunk++)
        for (Transfer direction : {Transfer::activation, Transfer::gradient}) {
          const int tag = transfer_tag(direction, mb, chunk, chunks);
          ASSERT_GE(tag, 0);
          ASSERT_TRUE(tags.insert(tag).second) << "mb " << mb << " chunk " << chunk << " of " << chunks;
        }
    EXPECT_EQ(*tags.rbegin(), 2 * m * chunks - 1);  // dense: no tag left unused
  }
}

TEST(Schedule, StageLayers) {
  EXPECT_EQ(stage_layer_counts(12, 4, ""), (std::vector<int>{3, 3, 3, 3}));
  EXPECT_EQ(stage_layer_counts(10, 4, ""), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(stage_layer_counts(8, 3, "3,3,2"), (std::vector<int>{3, 3, 2}));
  const StageSpec middle = stage_spec(10, 2, 4, "");
  ASSERT_EQ(middle.chunks.size(), 1u);
  EXPECT_EQ(middle.chunks[0].first, 6);
  EXPECT_EQ(middle.chunks[0].count, 2);
  EXPECT_FALSE(middle.has_embedding);
  EXPECT_FALSE(middle.has_head);
  EXPECT_TRUE(stage_spec(10, 0, 4, "").has_embedding);
  EXPECT_TRUE(stage_spec(10, 3, 4, "").has_head);
  EXPECT_THROW(stage_layer_counts(2, 3, ""), UsageError);         // more stages than layers
  EXPECT_THROW(stage_layer_counts(8, 3, "3,3,3"), UsageError);    // sums to 9
  EXPECT_THROW(stage_layer_counts(8, 3, "4,4"), UsageError);      // 2 stages listed
  EXPECT_THROW(stage_layer_counts(8, 2, "4,x"), UsageError);
  EXPECT_THROW(stage_layer_counts(8, 2, "8,0"), UsageError);
  EXPECT_THROW(parse_choice<Schedule>("interleaving"), UsageError);
}

}  // namespace
}  // namespace trident
