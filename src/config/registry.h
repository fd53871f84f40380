// Things registered by name at static initialization (model families, optimizers), looked
// up by the config's choice: each registering file holds `const bool registered =
// registry.add(name, value)`, and nothing else lists them. Their names are kept by config
// key as well, apart from the things, so that the config checks model.family and
// train.optimizer without including what they name (model/, optim/ stand above config/).
#pragma once

#include <map>
#include <string>

namespace trident {

// Records `name` as a choice of the config key `key` ("model.family"); fails if it is one
// already.
void register_choice(const char* key, const std::string& name);
// UsageError "KEY must be a or b, got 'name'" for a name nobody registered under `key`
// (with the name meant, when it is close to one).
void check_registered_choice(const char* key, const std::string& name);
// The names registered under `key`, sorted: "a or b".
std::string registered_choices(const char* key);

template <class T>
class Registry {
 public:
  // key: the config key that names them ("model.family"), for the error.
  explicit Registry(const char* key) : key_(key) {}

  bool add(const std::string& name, T value) {
    register_choice(key_, name);
    entries_.emplace(name, std::move(value));
    return true;
  }
  // UsageError as check_registered_choice's for a name nobody registered.
  const T& at(const std::string& name) const {
    check_registered_choice(key_, name);
    return entries_.at(name);
  }

 private:
  const char* key_;
  std::map<std::string, T> entries_;
};

}  // namespace trident
