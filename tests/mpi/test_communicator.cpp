// The communicator layer under mpirun (-np 2 and 4): each operation against the values
// it must produce, on the world and on the groups of a grid.
#include <gtest/gtest.h>
#include <mpi.h>

#include "mpi_test_helpers.h"

#include <numeric>

#include "parallel/parallel_state.h"
#include "kernels/kernels.h"

namespace trident {
namespace {

using namespace testing_helpers;

// dp = world: the dp group is the world.
ParallelState data_parallel_state() { return ParallelState(ParallelDims::resolve(world_size(), {{Axis::dp, 0}}), 0, 60); }

TEST(Communicator, AllReduceSumAndMax) {
  ParallelState ps = data_parallel_state();
  Communicator& c = ps.dp();
  const int n = c.size(), r = c.rank();
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); i++) x[i] = static_cast<float>(r + 1) * i;
  c.all_reduce(std::span<float>(x));
  for (size_t i = 0; i < x.size(); i++) ASSERT_FLOAT_EQ(x[i], n * (n + 1) / 2.0f * i);
  EXPECT_DOUBLE_EQ(c.all_reduce(static_cast<double>(r), ReduceOp::max), n - 1.0);
  EXPECT_EQ(c.stats().calls[static_cast<int>(CommOp::all_reduce)], 2u);
  EXPECT_EQ(c.stats().bytes[static_cast<int>(CommOp::all_reduce)], 1000 * 4 + 8u);
}

TEST(Communicator, ActivationsTravelInTheirStorageType) {
  ParallelState ps = data_parallel_state();
  Communicator& c = ps.dp();
  const int n = c.size(), r = c.rank();
  std::vector<float> x(64, static_cast<float>(r + 1));
  c.all_reduce(ActivationSpan{kernels::as_act(x.data()), x.size(), kernels::DType::f32});
  EXPECT_EQ(x, std::vector<float>(64, n * (n + 1) / 2.0f));
  EXPECT_EQ(c.stats().bytes[static_cast<int>(CommOp::all_reduce)], 64 * 4u);
  // Host memory holds float activations only; bf16 ones live on a GPU and go through NCCL.
  std::vector<uint16_t> bf16(64);
  EXPECT_THROW(c.all_reduce(ActivationSpan{reinterpret_cast<kernels::Act*>(bf16.data()), bf16.size(),
                                           kernels::DType::bf16}),
               std::runtime_error);
}

TEST(Communicator, ReduceScatterThenAllGather) {
  ParallelState ps = data_parallel_state();
  Communicator& c = ps.dp();
  const int n = c.size(), r = c.rank(), block = 37;  // odd sizes on purpose
  std::vector<float> in(static_cast<size_t>(block) * n), out(block);
  for (size_t i = 0; i < in.size(); i++) in[i] = static_cast<float>(i + 100 * r);
  c.reduce_scatter(in, out);
  // Block r of the sum over ranks of (i + 100 q).
  for (int i = 0; i < block; i++) ASSERT_FLOAT_EQ(out[i], n * (r * block + i) + 100.0f * n * (n - 1) / 2);
  std::vector<float> all(in.size(), -1.0f);
  std::copy(out.begin(), out.end(), all.begin() + static_cast<size_t>(r) * block);
  c.all_gather(all);
  for (size_t i = 0; i < all.size(); i++) ASSERT_FLOAT_EQ(all[i], n * i + 100.0f * n * (n - 1) / 2);
}

TEST(Communicator, BroadcastSendRecvBarrier) {
  ParallelState ps = data_parallel_state();
  Communicator& c = ps.world();
  const int n = c.size(), r = c.rank();
  std::vector<float> x(10, static_cast<float>(r));
  c.broadcast(x, n - 1);
  EXPECT_EQ(x, std::vector<float>(10, static_cast<float>(n - 1)));
  // A ring: send to the next rank, receive from the previous one.
  std::vector<float> mine(5, static_cast<float>(r)), theirs(5, -1.0f);
  RequestPtr recv = c.recv_async(theirs, (r + n - 1) % n, 7);
  c.send(mine, (r + 1) % n, 7);
  recv->wait();
  EXPECT_EQ(theirs, std::vector<float>(5, static_cast<float>((r + n - 1) % n)));
  c.barrier();
}

TEST(Communicator, GroupsOfTheGrid) {
  const int n = world_size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  // tp = 2: consecutive pairs; dp = the rest.
  ParallelState ps(ParallelDims::resolve(n, {{Axis::dp, 0}, {Axis::tp, 2}}), 0, 60);
  EXPECT_EQ(ps.tp().size(), 2);
  EXPECT_EQ(ps.dp().size(), n / 2);
  EXPECT_EQ(ps.pp().size(), 1);
  EXPECT_EQ(ps.tp().rank(), ps.rank() % 2);
  // The sum of world ranks over my tp group is that of the pair {2k, 2k+1}.
  const double pair = ps.tp().all_reduce(static_cast<double>(ps.rank()));
  EXPECT_EQ(pair, 2.0 * (ps.rank() / 2 * 2) + 1);
  const double column = ps.dp().all_reduce(static_cast<double>(ps.rank()));
  double expected = 0;
  for (int q = ps.rank() % 2; q < n; q += 2) expected += q;
  EXPECT_EQ(column, expected);
}

// Expert parallelism's exchange: rank r sends rank p a block of (r + 2 p + 1) % 3 elements
// (some empty, its own 1), each element naming its sender, receiver and place; every block
// arrives at its place. The bytes counted are those that leave the rank (not its own block).
TEST(Communicator, AllToAllVDeliversEveryBlockWhereItBelongs) {
  ParallelState ps = data_parallel_state();
  Communicator& c = ps.world();
  const int n = c.size(), r = c.rank();
  const auto count = [](int from, int to) { return static_cast<size_t>((from + 2 * to + 1) % 3); };
  const auto value = [](int from, int to, size_t i) { return 1000.0f * from + 10.0f * to + static_cast<float>(i); };
  std::vector<size_t> sent(n), received(n);
  std::vector<float> out, in;
  for (int p = 0; p < n; p++) {
    sent[p] = count(r, p);
    received[p] = count(p, r);
    for (size_t i = 0; i < sent[p]; i++) out.push_back(value(r, p, i));
  }
  size_t expected = 0;
  for (size_t k : received) expected += k;
  in.assign(expected + 3, -1.0f);  // room to spare: only the counts are written
  out.push_back(0.0f);             // a buffer may be larger than its blocks
  c.all_to_all_v({kernels::as_act(out.data()), out.size(), kernels::DType::f32}, sent,
                 {kernels::as_act(in.data()), in.size(), kernels::DType::f32}, received);
  size_t at = 0;
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < received[p]; i++) ASSERT_EQ(in[at++], value(p, r, i)) << "from " << p;
  EXPECT_EQ(in[at], -1.0f);
  EXPECT_EQ(c.stats().calls[static_cast<int>(CommOp::all_to_all)], 1u);
  ASSERT_EQ(sent[r], 1u);
  EXPECT_EQ(c.stats().bytes[static_cast<int>(CommOp::all_to_all)], (out.size() - 1 - sent[r]) * sizeof(float));
}

// ep 2 over dp: consecutive pairs exchange tokens; the ranks at the same place in every pair
// hold the same experts.
TEST(Communicator, ExpertParallelGroups) {
  const int n = world_size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  ParallelDims dims = ParallelDims::resolve(n, {{Axis::dp, 0}});
  dims.set_ep(2);
  ParallelState ps(dims, 0, 60);
  ASSERT_NE(ps.expert_parallel(), nullptr);
  EXPECT_EQ(ps.expert_parallel()->size(), 2);
  EXPECT_EQ(ps.expert_parallel()->rank(), ps.rank() % 2);
  EXPECT_EQ(ps.expert_parallel()->all_reduce(static_cast<double>(ps.rank())), 2.0 * (ps.rank() / 2 * 2) + 1);
  Communicator& holding = ps.group({MeshAxis::edp});
  EXPECT_EQ(holding.size(), n / 2);
  double holders = 0;
  for (int q = ps.rank() % 2; q < n; q += 2) holders += q;
  EXPECT_EQ(holding.all_reduce(static_cast<double>(ps.rank())), holders);
  // One communicator per set of ranks: ep with edp spans dp x cp, and is its group.
  EXPECT_EQ(&ps.group({MeshAxis::ep, MeshAxis::edp}), &ps.data_parallel());
  EXPECT_EQ(data_parallel_state().expert_parallel(), nullptr);  // ep 1: none
}

TEST(Communicator, NodesFromRanksPerNode) {
  const int n = world_size();
  ParallelState machine = data_parallel_state();
  EXPECT_EQ(machine.nodes(), 1);  // one machine runs every rank of these tests
  ParallelState split(ParallelDims::resolve(n, {{Axis::dp, 0}}), 1, 60);  // every rank its own "node"
  EXPECT_EQ(split.nodes(), n);
  EXPECT_EQ(split.node().size(), 1);
  if (n % 2 == 0) {
    ParallelState pairs(ParallelDims::resolve(n, {{Axis::dp, 0}}), 2, 60);
    EXPECT_EQ(pairs.nodes(), n / 2);
    EXPECT_EQ(pairs.node().rank(), pairs.rank() % 2);
  }
}

}  // namespace
}  // namespace trident
