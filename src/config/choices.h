// The config's named choices as enums, read once when the config is parsed (a bad name is
// one UsageError naming the key and the choices) and written back by name. Every other
// file compares enums, never strings.
//
// A new choice: an enum (its values in the order of its names) and a Choices<E> entry
// with the key and the names.
#pragma once

#include <array>
#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>

#include "kernels/dtype.h"

namespace trident {

enum class Schedule { one_f_one_b, gpipe, interleaved, zb1 };  // parallel.schedule (pipeline/schedule.h)
enum class Recompute { none, selective, full };      // train.recompute
enum class RecomputeMethod { uniform, block };       // train.recompute_method (model/activations.h)
enum class LrShape { cosine, linear, constant, wsd };  // train.lr_schedule (optim/lr_schedule.h)
enum class PrecisionSetting { fp32, bf16, automatic };  // train.precision (auto: bf16 on cuda, fp32 on cpu)
enum class TokenizerKind { byte, gpt2, llama3, sentencepiece };  // data.tokenizer
using kernels::Device;                               // train.device

template <class E>
struct Choices {};  // specialized below for each choice
template <>
struct Choices<Schedule> {
  static constexpr const char* key = "parallel.schedule";
  static constexpr std::array<const char*, 4> names = {"1f1b", "gpipe", "interleaved", "zb1"};
};
template <>
struct Choices<Recompute> {
  static constexpr const char* key = "train.recompute";
  static constexpr std::array<const char*, 3> names = {"none", "selective", "full"};
};
template <>
struct Choices<RecomputeMethod> {
  static constexpr const char* key = "train.recompute_method";
  static constexpr std::array<const char*, 2> names = {"uniform", "block"};
};
template <>
struct Choices<LrShape> {
  static constexpr const char* key = "train.lr_schedule";
  static constexpr std::array<const char*, 4> names = {"cosine", "linear", "constant", "wsd"};
};
template <>
struct Choices<PrecisionSetting> {
  static constexpr const char* key = "train.precision";
  static constexpr std::array<const char*, 3> names = {"fp32", "bf16", "auto"};
};
template <>
struct Choices<TokenizerKind> {
  static constexpr const char* key = "data.tokenizer";
  static constexpr std::array<const char*, 4> names = {"byte", "gpt2", "llama3", "sentencepiece"};
};
template <>
struct Choices<Device> {
  static constexpr const char* key = "train.device";
  static constexpr std::array<const char*, 2> names = {"cpu", "cuda"};
};

// Every value has its name (the last value of each enum, then the size of its table).
static_assert(static_cast<size_t>(Schedule::zb1) + 1 == Choices<Schedule>::names.size());
static_assert(static_cast<size_t>(Recompute::full) + 1 == Choices<Recompute>::names.size());
static_assert(static_cast<size_t>(RecomputeMethod::block) + 1 == Choices<RecomputeMethod>::names.size());
static_assert(static_cast<size_t>(LrShape::wsd) + 1 == Choices<LrShape>::names.size());
static_assert(static_cast<size_t>(PrecisionSetting::automatic) + 1 == Choices<PrecisionSetting>::names.size());
static_assert(static_cast<size_t>(TokenizerKind::sentencepiece) + 1 == Choices<TokenizerKind>::names.size());
static_assert(static_cast<size_t>(Device::cuda) + 1 == Choices<Device>::names.size());

template <class E>
const char* name_of(E value) {
  return Choices<E>::names[static_cast<size_t>(value)];
}

// "a, b or c": the names, for messages (joined out of line: GCC 12 at -O3 -march=native
// built "a, b, c" from the inline loop).
std::string join_choices(const char* const* names, size_t count);

template <class E>
std::string choice_list() {
  const auto& names = Choices<E>::names;
  return join_choices(names.data(), names.size());
}

// UsageError "KEY must be a, b or c, got 'text'", with " (did you mean b?)" when text is
// close to one of the names (config/did_you_mean.h).
[[noreturn]] void throw_bad_choice(const char* key, const char* const* names, size_t count, std::string_view text);

// The value named `text`; UsageError "KEY must be a, b or c, got 'text'" otherwise.
template <class E>
E parse_choice(std::string_view text) {
  const auto& names = Choices<E>::names;
  for (size_t i = 0; i < names.size(); i++)
    if (text == names[i]) return static_cast<E>(i);
  throw_bad_choice(Choices<E>::key, names.data(), names.size(), text);
}

// Written by name (the printed config, help texts, messages).
template <class E, class = decltype(Choices<E>::key)>
std::ostream& operator<<(std::ostream& out, E value) {
  return out << name_of(value);
}

}  // namespace trident

namespace trident::kernels {
using trident::operator<<;  // Device is found through its own namespace
}  // namespace trident::kernels
