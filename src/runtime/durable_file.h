// Files that are whole or absent after a crash at any instant: written under a temporary
// name, synced, renamed, and the folder synced (checkpoints' manifests, run summaries).
#pragma once

#include <string>

namespace trident {

// fsync a file or a folder, so that a rename after it is durable. UsageError on failure.
void sync_path(const std::string& path);
// Writes `text` to path.tmp, syncs it, renames it to `path` and syncs the folder.
void write_text_atomically(const std::string& path, const std::string& text);

}  // namespace trident
