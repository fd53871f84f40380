// What a pipeline schedule costs beyond its micro-batches' passes, on the busiest stage:
// the bubble (idle time in fill and drain) and the transfers on the critical path. F, B
// and W are one micro-batch's forward, input-gradient and weight-gradient times on a stage
// (all of its chunks together); for GEMM-bound layers B and W are each about F.
//   1F1B, GPipe  (p - 1)(F + B + W)
//   interleaved  (p - 1)(F + B + W) / V: each of the V chunks is 1/V of the stage
//   zb1          (p - 1)(F + B - W): ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline
//                Parallelism", section 3) fills the drain with deferred W passes; when W
//                exceeds F or B a stage still waits a whole F or B per stage ahead of it:
//                (p - 1) max(F, B, F + B - W) (pipeline/schedule.h plays it out). Issue 29
//                quotes (p - 1)(F + B - 2W), which is ZB-H2's, a schedule that holds more
//                activations (2p - 1 micro-batches on the first stage); trident runs ZB-H1.
#pragma once

#include "config/choices.h"
#include "pipeline/schedule_timing.h"

namespace trident {

// stage: F, B and W of one micro-batch on the stage.
double pipeline_bubble(Schedule schedule, int stages, int chunks, const PassTimes& stage);

// Activation (forward) and gradient (backward) transfers between stages on the critical
// path: 2 (p - 1) in fill and drain; interleaved passes each micro-batch V times round
// the stages, with V times as many transfers of the same size.
int critical_path_transfers(Schedule schedule, int stages, int chunks);

}  // namespace trident
