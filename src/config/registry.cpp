#include "config/registry.h"

#include <set>
#include <vector>

#include "config/choices.h"
#include "kernels/base/error.h"

namespace trident {

namespace {

// The registered names of each key (a function's static: registrations run at static
// initialization, in no set order).
std::map<std::string, std::set<std::string>>& names_by_key() {
  static std::map<std::string, std::set<std::string>> names;
  return names;
}

std::vector<const char*> names_of(const char* key) {
  std::vector<const char*> out;
  for (const std::string& name : names_by_key()[key]) out.push_back(name.c_str());
  return out;
}

}  // namespace

void register_choice(const char* key, const std::string& name) {
  check(names_by_key()[key].insert(name).second, std::string(key) + " " + name + " registered twice");
}

void check_registered_choice(const char* key, const std::string& name) {
  if (names_by_key()[key].contains(name)) return;
  const std::vector<const char*> known = names_of(key);
  throw_bad_choice(key, known.data(), known.size(), name);
}

std::string registered_choices(const char* key) {
  const std::vector<const char*> known = names_of(key);
  return join_choices(known.data(), known.size());
}

}  // namespace trident
