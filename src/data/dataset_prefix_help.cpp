#include "data/dataset_prefix_help.h"

#include <algorithm>
#include <set>

#include "kernels/base/error.h"

namespace trident {

namespace {

// The name without its ".bin" / ".idx"; "" for another name.
std::string stem_of(const std::string& name) {
  if (name.size() > 4 && (name.ends_with(".bin") || name.ends_with(".idx"))) return name.substr(0, name.size() - 4);
  return "";
}

}  // namespace

std::vector<std::string> megatron_prefixes(const std::vector<std::string>& files) {
  const std::set<std::string> all(files.begin(), files.end());
  std::vector<std::string> prefixes;
  for (const std::string& f : all)
    if (f.ends_with(".bin") && all.contains(stem_of(f) + ".idx")) prefixes.push_back(stem_of(f));
  return prefixes;  // in the set's order: sorted
}

void refuse_one_file_of_dataset(const std::string& key_name, const std::string& entry, bool pair_exists) {
  const std::string prefix = stem_of(entry);
  require(prefix.empty() || !pair_exists, key_name + " '" + entry + "' is one file of the Megatron indexed dataset '" +
                                              prefix + "' (.bin + .idx): pass the prefix, --" + key_name + "=" + prefix);
}

void refuse_folder_of_datasets(const std::string& key_name, const std::string& entry,
                               const std::vector<std::string>& prefixes) {
  if (prefixes.empty()) return;
  const std::string start = key_name + " '" + entry + "' is a folder holding ";
  if (prefixes.size() == 1)
    throw UsageError(start + "the Megatron indexed dataset '" + prefixes[0] + "' (.bin + .idx): pass the prefix, --" +
                     key_name + "=" + prefixes[0]);
  std::string names, blend;
  for (size_t i = 0; i < prefixes.size(); i++) {
    if (i < 4) names += (i == 0 ? "'" : ", '") + prefixes[i] + "'";
    if (i < 2) blend += (i == 0 ? "1 " : " 1 ") + prefixes[i];
  }
  if (prefixes.size() > 4) names += ", ...";
  throw UsageError(start + std::to_string(prefixes.size()) + " Megatron indexed datasets (" + names +
                   "): pass a prefix, --" + key_name + "=" + prefixes[0] + ", or a blend of them, --" + key_name +
                   "='" + blend + (prefixes.size() > 2 ? " ...'" : "'"));
}

}  // namespace trident
