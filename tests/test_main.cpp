// The main of every test binary: MPI is initialized (a singleton without mpirun), the
// tests run on every rank, and a test counts as passed only if it passed on all ranks.
// Rank 0 prints "MPI summary: N tests, F failed on some rank"; a failure names its rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "parallel/mpi_world.h"
#include "parallel/progress_board.h"

namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Prints every failed assertion with the rank that saw it.
class RankFailurePrinter : public testing::EmptyTestEventListener {
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED at %s:%d\n%s\n", world_rank(), r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }
};

}  // namespace

int main(int argc, char** argv) {
  trident::tune_mpi_before_init();
  MPI_Init(&argc, &argv);
  trident::progress_board::open();
  testing::InitGoogleTest(&argc, argv);
  int rank = world_rank(), size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());  // one report, from rank 0
  listeners.Append(new RankFailurePrinter);
  const int local_verdict = RUN_ALL_TESTS();  // combined over ranks below, from the failed tests
  (void)local_verdict;

  // Every rank ran the same tests in the same order: combine their verdicts.
  std::vector<int> failed;
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); s++) {
    const testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); t++)
      if (suite.GetTestInfo(t)->should_run()) failed.push_back(suite.GetTestInfo(t)->result()->Failed() ? 1 : 0);
  }
  MPI_Allreduce(MPI_IN_PLACE, failed.data(), static_cast<int>(failed.size()), MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  int failures = 0;
  for (int f : failed) failures += f;
  if (rank == 0)
    std::printf("MPI summary: %zu tests on %d rank(s), %d failed on some rank\n", failed.size(), size, failures);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
