// Small GPT-2 shapes for tests: the five sizes that matter, every other setting default.
#pragma once

#include "config/config.h"

namespace trident {

inline ModelConfig gpt2_shape(int n_layer, int n_head, int d_model, int seq_len, int vocab_size) {
  ModelConfig m;
  m.n_layer = n_layer;
  m.n_head = n_head;
  m.d_model = d_model;
  m.seq_len = seq_len;
  m.vocab_size = vocab_size;
  return m;
}

}  // namespace trident
