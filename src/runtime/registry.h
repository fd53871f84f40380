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
  // UsageError "KEY must be a or b, got 'name'" for a name nobody registered (with the
  // name meant, when it is close to one).
  const T& at(const std::string& name) const {
    const auto it = entries_.find(name);
    if (it == entries_.end()) {
      const std::vector<const char*> known = names();
      throw_bad_choice(key_, known.data(), known.size(), name);
    }
    return it->second;
  }
  std::string choices() const {  // "a or b", sorted
    const std::vector<const char*> known = names();
    return join_choices(known.data(), known.size());
  }

 private:
  std::vector<const char*> names() const {
    std::vector<const char*> out;
    for (const auto& [name, value] : entries_) out.push_back(name.c_str());
    return out;
  }

  const char* key_;
  std::map<std::string, T> entries_;
};

}  // namespace trident
