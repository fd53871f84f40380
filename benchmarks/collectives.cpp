// Collective bandwidth in the style of nccl-tests, through trident's communicator layer
// and, beside it in the same run, the same operation called directly through MPI.
//
//   mpirun -np 4 build/bench/collectives [--max-mb 64] [--iters 20]
//
// size: bytes of the whole buffer (all-reduce: the buffer; reduce-scatter: the input;
// all-gather: the output), algbw = size / time, busbw = algbw * factor, where the factor
// is 2(n-1)/n for all-reduce and (n-1)/n for the others (nccl-tests' PERFORMANCE.md).
// Results are checked before timing: #wrong counts elements off the expected values.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "parallel/mpi_communicator.h"
#include "parallel/mpi_world.h"
#include "kernels/base/memory.h"

using namespace trident;

namespace {

enum class Op { all_reduce, reduce_scatter, all_gather };
const char* name(Op op) { return op == Op::all_reduce ? "all_reduce" : op == Op::reduce_scatter ? "reduce_scatter" : "all_gather"; }

struct Buffers {
  std::vector<float> data, out;
};

// One call of `op` on `count` floats (the whole buffer), via the layer or via MPI.
void call(Op op, bool direct, Communicator& layer, MPI_Comm comm, Buffers& b, size_t count, int ranks) {
  const size_t block = count / ranks;
  std::span<float> data(b.data.data(), count);
  if (op == Op::all_reduce) {
    if (direct) MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm);
    else layer.all_reduce(data);
  } else if (op == Op::reduce_scatter) {
    if (direct) MPI_Reduce_scatter_block(data.data(), b.out.data(), static_cast<int>(block), MPI_FLOAT, MPI_SUM, comm);
    else layer.reduce_scatter(data, {b.out.data(), block});
  } else {
    if (direct) MPI_Allgather(MPI_IN_PLACE, static_cast<int>(block), MPI_FLOAT, data.data(), static_cast<int>(block), MPI_FLOAT, comm);
    else layer.all_gather(data);
  }
}

// Fills inputs so that every result element is known, runs once, counts wrong elements.
long check(Op op, bool direct, Communicator& layer, MPI_Comm comm, Buffers& b, size_t count, int rank, int ranks) {
  const size_t block = count / ranks;
  for (size_t i = 0; i < count; i++) b.data[i] = static_cast<float>((rank + 1) * (i % 7));
  call(op, direct, layer, comm, b, count, ranks);
  const float sum_ranks = ranks * (ranks + 1) / 2.0f;
  long wrong = 0;
  if (op == Op::all_reduce) {
    for (size_t i = 0; i < count; i++) wrong += b.data[i] != sum_ranks * (i % 7);
  } else if (op == Op::reduce_scatter) {
    for (size_t i = 0; i < block; i++) wrong += b.out[i] != sum_ranks * ((rank * block + i) % 7);
  } else {
    for (size_t i = 0; i < count; i++) wrong += b.data[i] != static_cast<float>((i / block + 1) * (i % 7));
  }
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, comm);
  return wrong;
}

double time_us(Op op, bool direct, Communicator& layer, MPI_Comm comm, Buffers& b, size_t count, int ranks, int iters) {
  call(op, direct, layer, comm, b, count, ranks);  // warm-up
  MPI_Barrier(comm);
  const double start = MPI_Wtime();
  for (int i = 0; i < iters; i++) call(op, direct, layer, comm, b, count, ranks);
  double t = (MPI_Wtime() - start) / iters;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);  // the slowest rank sets the pace
  return t * 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory();  // else Open MPI's large temporary buffers pay first touch every call
  MpiWorld world(&argc, &argv);  // MPI_Init with trident's tuning
  double max_mb = 64;
  int iters = 20;
  for (int i = 1; i + 1 < argc; i++) {
    if (!std::strcmp(argv[i], "--max-mb")) max_mb = std::stod(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters")) iters = std::stoi(argv[++i]);
  }
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MpiCommunicator layer(MPI_COMM_WORLD, "world", std::make_shared<Watchdog>());
  const size_t max_count = static_cast<size_t>(max_mb * (1 << 20) / sizeof(float)) / ranks * ranks;
  Buffers b;
  b.data.assign(max_count, 0.0f);
  b.out.assign(max_count / ranks + 1, 0.0f);

  if (rank == 0) std::printf("# %d ranks, float32, %d iterations per size; time in us, bandwidth in GB/s\n", ranks, iters);
  for (Op op : {Op::all_reduce, Op::reduce_scatter, Op::all_gather}) {
    const double factor = op == Op::all_reduce ? 2.0 * (ranks - 1) / ranks : static_cast<double>(ranks - 1) / ranks;
    if (rank == 0) {
      std::printf("\n## %s\n", name(op));
      std::printf("| size (B) | count | type | layer time | layer algbw | layer busbw | #wrong | MPI time | MPI algbw | MPI busbw | #wrong | layer/MPI |\n");
      std::printf("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    }
    double sum_layer = 0, sum_mpi = 0;
    int rows = 0;
    for (size_t count = 256 * ranks; count <= max_count; count *= 4) {
      count = count / ranks * ranks;
      const long wrong_layer = check(op, false, layer, MPI_COMM_WORLD, b, count, rank, ranks);
      const long wrong_mpi = check(op, true, layer, MPI_COMM_WORLD, b, count, rank, ranks);
      const int n = count * 4 > (16u << 20) ? std::max(3, iters / 4) : iters;
      const double t_layer = time_us(op, false, layer, MPI_COMM_WORLD, b, count, ranks, n);
      const double t_mpi = time_us(op, true, layer, MPI_COMM_WORLD, b, count, ranks, n);
      const double bytes = count * 4.0;
      const double alg_layer = bytes / t_layer / 1e3, alg_mpi = bytes / t_mpi / 1e3;
      sum_layer += alg_layer * factor;
      sum_mpi += alg_mpi * factor;
      rows++;
      if (rank == 0)
        std::printf("| %.0f | %zu | float | %.1f | %.3f | %.3f | %ld | %.1f | %.3f | %.3f | %ld | %.2f |\n", bytes, count,
                    t_layer, alg_layer, alg_layer * factor, wrong_layer, t_mpi, alg_mpi, alg_mpi * factor, wrong_mpi,
                    t_mpi / t_layer);
    }
    if (rank == 0)
      std::printf("average busbw: layer %.3f GB/s, direct MPI %.3f GB/s\n", sum_layer / rows, sum_mpi / rows);
  }
  return 0;
}
