// Things registered by name at static initialization (model families, optimizers), looked
// up by the config's choice: each registering file holds `const bool registered =
// registry.add(name, value)`, and nothing else lists them.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "config/choices.h"
#include "kernels/base/error.h"

namespace trident {

template <class T>
class Registry {
 public:
  // key: the config key that names them ("model.family"), for the error.
  explicit Registry(const char* key) : key_(key) {}

  bool add(const std::string& name, T value) {
    check(!entries_.contains(name), std::string(key_) + " " + name + " registered twice");
    entries_.emplace(name, std::move(value));
    return true;
  }
  // UsageError "KEY must be a or b, got 'name'" for a name nobody registered.
  const T& at(const std::string& name) const {
    const auto it = entries_.find(name);
    if (it == entries_.end()) throw_bad_choice(key_, choices(), name);
    return it->second;
  }
  std::string choices() const {  // "a or b", sorted
    std::vector<const char*> names;
    for (const auto& [name, value] : entries_) names.push_back(name.c_str());
    return join_choices(names.data(), names.size());
  }

 private:
  const char* key_;
  std::map<std::string, T> entries_;
};

}  // namespace trident
