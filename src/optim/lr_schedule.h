// The learning rate of each step: linear warmup from lr/warmup to lr over warmup_steps,
// then one of four shapes down to min_lr, which is reached at step decay_steps (Megatron's
// --lr-decay-iters; train.lr_decay_steps, default train.steps) and kept after it, so that
// a run extended past its plan stays on the curve it was on:
//   cosine    min_lr + (lr - min_lr) (1 + cos(pi p)) / 2   (llm.c, nanoGPT, Megatron's default)
//   linear    lr - (lr - min_lr) p
//   constant  lr (min_lr unused)
//   wsd       warmup-stable-decay: lr until the last `wsd_decay` steps before decay_steps,
//             then linear to min_lr over them (MiniCPM; Hagele et al. 2024)
// p runs from 0 after the warmup (wsd: at the start of its decay) to 1 at decay_steps - 1.
// step counts from 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "config/choices.h"  // LrShape: train.lr_schedule, read by name

namespace trident {

struct LearningRateSchedule {
  double lr = 1e-3, min_lr = 0.0;
  int warmup_steps = 0, decay_steps = 1;  // decay_steps: where min_lr is reached
  LrShape shape = LrShape::cosine;
  int wsd_decay = 0;  // wsd: the steps of its final decay

  double at(int step) const {
    if (step < warmup_steps) return lr * (step + 1) / warmup_steps;
    if (shape == LrShape::constant) return lr;
    const int begin = shape == LrShape::wsd ? std::max(warmup_steps, decay_steps - wsd_decay) : warmup_steps;
    const int span = decay_steps - begin;
    if (step < begin) return lr;  // wsd's stable part
    if (span <= 1) return min_lr;  // a decay of one step (or none left): its last is the floor
    const double progress = std::min(1.0, static_cast<double>(step - begin) / (span - 1));
    if (shape == LrShape::cosine) return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
    return lr - (lr - min_lr) * progress;  // linear, and wsd's decay
  }
  // "cosine: warmup 50 steps to 2.00e-03, then down to 2.00e-04 at step 600"
  std::string describe() const;
};

}  // namespace trident
