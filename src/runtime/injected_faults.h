// The faults the tests inject into real runs, all in one place: each is asked for by a
// TRIDENT_TEST_* variable, and without one nothing here does anything. The run calls one
// hook where each fault would strike (a step's start, the reduced gradients, a save's
// stages); what the fault does, and when, is decided here. Ranks are world ranks, steps
// the printed numbers (from 1) unless said otherwise.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "kernels/kernels.h"

namespace trident::injected_faults {

// TRIDENT_TEST_STALL_RANK=r: rank r stops participating at step TRIDENT_TEST_STALL_STEP
// (from 0, default 1), as a dead node would; TRIDENT_TEST_STALL_SIGNAL=STOP stops it with
// SIGSTOP (no thread of it runs on), STOP_IN_WAIT inside its next wait for a collective
// it has started (as a SIGSTOP from outside may land): waiting_now() tells when it is.
void stall(int rank, int step_from_0, const std::function<bool()>& waiting_now);

// TRIDENT_TEST_SLOW_RANK=r: rank r's every step TRIDENT_TEST_SLOW_MS (default 200)
// longer, as a slow GPU or a throttled node would; returns the seconds it slept.
double slow_down(int rank);
bool slows_a_rank();  // whether some rank is slowed (straggler reports stay on)

// TRIDENT_TEST_NAN_RANK=r, TRIDENT_TEST_NAN_STEPS="4" or "4-9": a NaN in one of rank r's
// reduced gradients at those steps, as an overflow would. first_counted() finds a
// gradient the norm counts (a device pointer, null if none; and its tensor's name).
void poison_gradient(int rank, int step, kernels::Kernels& k,
                     const std::function<std::pair<float*, std::string>()>& first_counted);

// TRIDENT_TEST_FLIP_BIT=RANK:STEP[,STEP...]: after the update of each listed step (once
// each per process: a rollback passes it again), one mantissa bit of the flat parameter
// `at` flips, as a faulty GPU's memory would. The parameters go through host memory:
// read(flat) and write(flat) of `floats` floats.
void flip_bit(int rank, int step, size_t floats, size_t at, const std::function<void(float*)>& read,
              const std::function<void(const float*)>& write);

// Saving step N of a checkpoint:
// TRIDENT_TEST_SAVE_FAULT=R:N:kill (or :stop): rank R, a node leader's helper, dies of
// SIGKILL (stops with SIGSTOP, as a hung node would) while handing its pieces over.
void while_handing_pieces(int rank, int step);
// TRIDENT_TEST_KILL_DURING_WRITE=N: the node leader kills itself (SIGKILL, as `kill -9`
// would) halfway through its node file.
void while_writing_node_file(int step);
// TRIDENT_TEST_ABORT_BEFORE_MANIFEST=N: the job aborts after every node file is written
// and before the manifest, as a crash there would.
void before_manifest(int step);

// TRIDENT_TEST_DATA_COPY_AT_STEP=N: the s3:// token files a node leader copies while
// training reads them (data.wait_for_copy false) are copied at step N's start, the step
// waiting for it: the steps before read them streamed, those after from their copies.
bool holds_data_copy();
void copy_data_at(int step, const std::function<void()>& copy_now);

// TRIDENT_TEST_VERIFY_DROP=R:NAME: `trident verify` on rank R compares nothing of tensor
// NAME, as a layout that lost it there would.
bool verify_drops(int rank, const std::string& tensor);

}  // namespace trident::injected_faults
