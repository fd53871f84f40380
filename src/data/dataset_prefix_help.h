// A Megatron indexed dataset (<prefix>.bin + <prefix>.idx) named other than by its prefix:
// one of its two files, or the folder holding it. Local and s3:// entries get the same
// help, saying what to pass instead.
#pragma once

#include <string>
#include <vector>

namespace trident {

// The prefixes of the Megatron datasets among `files` (paths or keys): each name whose
// .bin and .idx are both among them, sorted.
std::vector<std::string> megatron_prefixes(const std::vector<std::string>& files);

// UsageError when `entry` (the value of `key_name`: data.path, data.val_path) is the .bin
// or the .idx of a dataset whose pair is there (`pair_exists`): pass the prefix.
void refuse_one_file_of_dataset(const std::string& key_name, const std::string& entry, bool pair_exists);

// UsageError when the folder `entry` holds Megatron datasets (`prefixes`, named as the
// entry names the folder): pass a prefix, or a blend of them.
void refuse_folder_of_datasets(const std::string& key_name, const std::string& entry,
                               const std::vector<std::string>& prefixes);

}  // namespace trident
