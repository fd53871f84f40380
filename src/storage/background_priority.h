// Threads that move checkpoints to S3 while training runs take the cores only when
// training leaves them idle (SCHED_IDLE): measured on a 2-core machine, an upload at
// normal priority, or even at nice 10, slowed training's steps by 8-9%; at idle priority
// by nothing measurable, and it still went at the store's speed. So that an upload cannot
// starve on a node whose cores are always busy (CPU training, MPI polling), a thread still
// at it after kStarvedAfterSeconds of idle priority gets a share again (nice 10).
// Linux: both are per thread, and the threads a thread starts inherit them.
#pragma once

namespace trident {

inline constexpr double kStarvedAfterSeconds = 60;

// The calling thread (and the threads it starts) at idle priority from now on.
void run_in_background();
// Called by a background thread from time to time (each request, each progress report):
// after kStarvedAfterSeconds at idle priority, nice 10 instead. Cheap when not background.
void keep_background_moving();

}  // namespace trident
