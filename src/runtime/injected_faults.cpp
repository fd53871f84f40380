#include "runtime/injected_faults.h"

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "runtime/timer.h"

namespace trident::injected_faults {

namespace {

// The variable's integer, or `fallback` when it is not set.
int int_env(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : fallback;
}

std::string string_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

void announce(const std::string& what) {
  std::fprintf(stderr, "trident: %s\n", what.c_str());
  std::fflush(stderr);
}

}  // namespace

void stall(int rank, int step_from_0, const std::function<bool()>& waiting_now) {
  if (int_env("TRIDENT_TEST_STALL_RANK", -1) != rank || step_from_0 != int_env("TRIDENT_TEST_STALL_STEP", 1)) return;
  const std::string signal = string_env("TRIDENT_TEST_STALL_SIGNAL");
  announce("rank " + std::to_string(rank) + ": TRIDENT_TEST_STALL_RANK set: stalling at step " +
           std::to_string(step_from_0) +
           (signal == "STOP" ? " (SIGSTOP)" : signal == "STOP_IN_WAIT" ? " (SIGSTOP inside its next wait)" : ""));
  if (signal == "STOP_IN_WAIT") {
    std::thread([waiting_now] {
      while (!waiting_now()) std::this_thread::yield();
      raise(SIGSTOP);
    }).detach();
    return;
  }
  if (signal == "STOP") raise(SIGSTOP);
  while (true) pause();
}

bool slows_a_rank() { return std::getenv("TRIDENT_TEST_SLOW_RANK") != nullptr; }

double slow_down(int rank) {
  if (int_env("TRIDENT_TEST_SLOW_RANK", -1) != rank) return 0;
  Timer slept;
  std::this_thread::sleep_for(std::chrono::milliseconds(int_env("TRIDENT_TEST_SLOW_MS", 200)));
  return slept.seconds();
}

bool holds_data_copy() { return std::getenv("TRIDENT_TEST_DATA_COPY_AT_STEP") != nullptr; }

void copy_data_at(int step, const std::function<void()>& copy_now) {
  if (int_env("TRIDENT_TEST_DATA_COPY_AT_STEP", -1) == step) copy_now();
}

void poison_gradient(int rank, int step, kernels::Kernels& k,
                     const std::function<std::pair<float*, std::string>()>& first_counted) {
  const std::string steps = string_env("TRIDENT_TEST_NAN_STEPS");
  if (int_env("TRIDENT_TEST_NAN_RANK", -1) != rank || steps.empty()) return;
  const size_t dash = steps.find('-');
  const int first = std::atoi(steps.c_str()), last = dash == std::string::npos ? first : std::atoi(steps.c_str() + dash + 1);
  if (step < first || step > last) return;
  const auto [where, tensor] = first_counted();
  if (where == nullptr) return;
  const float nan = std::nanf("");
  k.copy_to_device(where, &nan, sizeof nan);
  announce("rank " + std::to_string(rank) + ": TRIDENT_TEST_NAN_RANK set: a NaN in " + tensor +
           "'s gradient at step " + std::to_string(step));
}

void flip_bit(int rank, int step, size_t floats, size_t at, const std::function<void(float*)>& read,
              const std::function<void(const float*)>& write) {
  static std::set<int> flipped;  // each listed step once per process (a rollback passes it again)
  const std::string spec = string_env("TRIDENT_TEST_FLIP_BIT");
  const size_t colon = spec.find(':');
  if (colon == std::string::npos || std::atoi(spec.c_str()) != rank) return;
  bool listed = false;
  std::istringstream steps(spec.substr(colon + 1));
  for (std::string s; std::getline(steps, s, ',');) listed |= std::atoi(s.c_str()) == step;
  if (!listed || !flipped.insert(step).second) return;
  std::vector<float> flat(floats);
  read(flat.data());
  uint32_t bits = 0;
  std::memcpy(&bits, &flat[at], sizeof bits);
  bits ^= 1u << 12;
  std::memcpy(&flat[at], &bits, sizeof bits);
  write(flat.data());
  announce("rank " + std::to_string(rank) + ": TRIDENT_TEST_FLIP_BIT set: one bit of parameter " + std::to_string(at) +
           " flipped after step " + std::to_string(step));
}

void while_handing_pieces(int rank, int step) {
  const std::string fault = string_env("TRIDENT_TEST_SAVE_FAULT");
  int at_rank = -1, at_step = -1;
  char how[8] = "";
  if (std::sscanf(fault.c_str(), "%d:%d:%7s", &at_rank, &at_step, how) != 3) return;
  if (at_rank != rank || at_step != step) return;
  announce("rank " + std::to_string(rank) + ": TRIDENT_TEST_SAVE_FAULT set: " + how +
           " while sending its pieces of step " + std::to_string(step));
  raise(std::string(how) == "stop" ? SIGSTOP : SIGKILL);
}

void while_writing_node_file(int step) {
  if (int_env("TRIDENT_TEST_KILL_DURING_WRITE", -1) == step) raise(SIGKILL);
}

void before_manifest(int step) {
  if (int_env("TRIDENT_TEST_ABORT_BEFORE_MANIFEST", -1) != step) return;
  announce("TRIDENT_TEST_ABORT_BEFORE_MANIFEST set: aborting between the node files and the manifest");
  MPI_Abort(MPI_COMM_WORLD, 9);
}

bool verify_drops(int rank, const std::string& tensor) {
  const std::string fault = string_env("TRIDENT_TEST_VERIFY_DROP");
  char* end = nullptr;
  const long at = std::strtol(fault.c_str(), &end, 10);
  if (end == fault.c_str() || *end != ':' || at != rank || std::string(end + 1) != tensor) return false;
  announce("rank " + std::to_string(rank) + ": TRIDENT_TEST_VERIFY_DROP set: " + tensor + " not compared here");
  return true;
}

}  // namespace trident::injected_faults
