// Pipeline schedules as pure arithmetic: which micro-batch (and model chunk) each stage
// runs at each tick, against the closed forms of 1F1B and GPipe, the stage layer split,
// and the tags of the transfers between stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "pipeline/schedule.h"
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
  EXPECT_EQ(middle.first_layer, 6);
  EXPECT_EQ(middle.layers, 2);
  EXPECT_FALSE(middle.has_embedding);
  EXPECT_FALSE(middle.has_head);
  EXPECT_TRUE(stage_spec(10, 0, 4, "").has_embedding);
  EXPECT_TRUE(stage_spec(10, 3, 4, "").has_head);
  EXPECT_THROW(stage_layer_counts(2, 3, ""), UsageError);         // more stages than layers
  EXPECT_THROW(stage_layer_counts(8, 3, "3,3,3"), UsageError);    // sums to 9
  EXPECT_THROW(stage_layer_counts(8, 3, "4,4"), UsageError);      // 2 stages listed
  EXPECT_THROW(stage_layer_counts(8, 2, "4,x"), UsageError);
  EXPECT_THROW(stage_layer_counts(8, 2, "8,0"), UsageError);
  EXPECT_THROW(parse_choice<Schedule>("interleaved"), UsageError);
}

}  // namespace
}  // namespace trident
