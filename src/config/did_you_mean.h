// Suggestions for a mistyped name: a key (--train.warmup: train.warmup_steps), a choice
// (Lion: lion, qwen3-moe: qwen3_moe), or a long name that other trainers and Hugging Face
// use for one of our keys (parallel.expert_parallel: parallel.ep).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace trident {

// The edits (insert, delete or replace one character) that turn a into b.
size_t edit_distance(std::string_view a, std::string_view b);

// The names `unknown` is a prefix of, else those the fewest edits away (at most a quarter
// of its length, 2 at least); empty when none is that close or more than 3 are.
std::vector<std::string> closest_names(std::string_view unknown, const std::vector<std::string>& names);

// The name `text` was meant as: one equal to it but for case and '-' for '_', else the one
// closest by closest_names's rule; "" when none or several are.
std::string closest_choice(std::string_view text, const char* const* names, size_t count);

// Our key for a name other trainers give it ("parallel.expert_parallel", or the bare
// "expert_parallel": "parallel.ep"; Hugging Face's "num_hidden_layers": "model.n_layer");
// "" when it is none of those.
std::string key_alias(std::string_view unknown_key);

}  // namespace trident
