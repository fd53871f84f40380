#pragma once

#include <cstddef>

namespace trident {

// Resident set size of this process now and at its peak (VmRSS, VmHWM), in bytes.
size_t resident_bytes();
size_t peak_resident_bytes();
// Returns the heap's free pages to the OS and sets the peak (VmHWM) back to the present
// size, so that the growth of peak_resident_bytes() measures what is allocated from
// here (Linux's /proc/self/clear_refs). False where the kernel refuses.
bool reset_peak_resident();

// RAM this process may still take: the kernel's MemAvailable, or less where a cgroup
// (a Slurm job's, a container's) limits it; and the RAM in all (or the cgroup's limit).
size_t available_memory_bytes();
size_t total_memory_bytes();

// Keeps glibc from returning large blocks to the OS: here fresh pages cost ~10 us
// each (shared/MACHINE.md), so every buffer should be touched once and then reused.
void keep_freed_memory();
// Hands the heap's free memory back to the system now (keep_freed_memory() keeps it
// otherwise): before a measurement of what comes next, so that nothing reuses it unseen.
void release_freed_memory();

}  // namespace trident
