// The layout keys `trident plan` chooses, and which of them the user pinned by setting
// them (a flag or the config file): only layouts with the pinned values are listed.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "config/config.h"

namespace trident {

// Every key the planner chooses.
const std::vector<std::string>& layout_keys();

struct LayoutPins {
  std::set<std::string> keys;  // of layout_keys()
  bool pinned(const std::string& key) const { return keys.count(key) > 0; }
  bool any() const { return !keys.empty(); }
  // "parallel.tp=8, parallel.zero=1": the pinned keys with their values in `config`.
  std::string describe(const Config& config) const;
};

// The layout keys among `given` (CommandLine::given). parallel.dp=0 means "derived", so
// it pins nothing.
LayoutPins layout_pins(const std::set<std::string>& given, const Config& config);

// The value of layout key `key` in `config`, as a flag writes it.
std::string layout_value(const Config& config, const std::string& key);

}  // namespace trident
