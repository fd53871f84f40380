#pragma once

#include <cstddef>

namespace trident {

// Resident set size of this process now and at its peak (VmRSS, VmHWM), in bytes.
size_t resident_bytes();
size_t peak_resident_bytes();

// Keeps glibc from returning large blocks to the OS: here fresh pages cost ~10 us
// each (shared/MACHINE.md), so every buffer should be touched once and then reused.
void keep_freed_memory();

}  // namespace trident
