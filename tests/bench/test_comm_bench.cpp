// `osprey bench comm` on the CPU twin (ranks as threads): nccl-tests' bus-bandwidth factors, the
// message sizes of DeepSeek-V3.2's steps, and a run on 2 and 4 ranks whose rows are positive and
// consistent (algbw = bytes / time, busbw = algbw · the factor of the op and world).
#include <gtest/gtest.h>

#include "bench/comm.h"
#include "core/error.h"

namespace osprey::bench {
namespace {

TEST(CommBench, BusBandwidthFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_reduce", 1), 0.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_reduce", 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_reduce", 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_reduce", 8), 1.75);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_to_all", 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_to_all", 8), 0.875);
  EXPECT_THROW(bus_bandwidth_factor("all_gather", 4), Error);
  EXPECT_THROW(bus_bandwidth_factor("all_reduce", 0), Error);
}

TEST(CommBench, MessageBytesAreV32Steps) {
  const CommBenchOptions o;  // hidden 7168, top-8
  EXPECT_EQ(comm_message_bytes("all_reduce", 1, o, 8), 7168 * 4);
  EXPECT_EQ(comm_message_bytes("all_reduce", 2048, o, 8), 2048LL * 7168 * 4);
  // T = 1, W = 8: 8 pairs, one row of [7168 + 2] F32 to each rank.
  EXPECT_EQ(comm_message_bytes("all_to_all", 1, o, 8), 8 * 7170 * 4);
  // T = 64, W = 4: 512 pairs, 128 rows to each rank.
  EXPECT_EQ(comm_message_bytes("all_to_all", 64, o, 4), 4LL * 128 * 7170 * 4);
}

void expect_consistent_run(int world) {
  dist::ParallelConfig p;
  p.tensor_parallel_size = world;
  CommBenchOptions o;
  o.tokens = {1, 64};
  o.warmup = 1;
  o.iters = 5;
  const std::vector<CommBenchRow> rows = run_comm_benchmark(p, Device::CPU, o);
  ASSERT_EQ(rows.size(), 4u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const CommBenchRow& r = rows[i];
    SCOPED_TRACE(r.op + " tokens " + std::to_string(r.tokens));
    EXPECT_EQ(r.op, i < 2 ? "all_reduce" : "all_to_all");
    EXPECT_EQ(r.tokens, i % 2 == 0 ? 1 : 64);
    EXPECT_EQ(r.bytes, comm_message_bytes(r.op, r.tokens, o, world));
    EXPECT_GT(r.median_s, 0);
    EXPECT_LT(r.median_s, 10.0);  // a few MB between threads
    EXPECT_NEAR(r.algbw_gbs, double(r.bytes) / r.median_s / 1e9, 1e-9 * r.algbw_gbs);
    // The factor spelled out here, not through bus_bandwidth_factor: 2(W−1)/W and (W−1)/W.
    const double w = world;
    const double factor = r.op == "all_reduce" ? 2 * (w - 1) / w : (w - 1) / w;
    EXPECT_NEAR(r.busbw_gbs, r.algbw_gbs * factor, 1e-9 * r.algbw_gbs);
    EXPECT_GT(r.busbw_gbs, 0);
  }
  // 64 tokens move 64× the bytes of one (all-reduce).
  EXPECT_EQ(rows[1].bytes, 64 * rows[0].bytes);
}

TEST(CommBench, TwoThreadRanks) {
  expect_consistent_run(2);
}
TEST(CommBench, FourThreadRanks) {
  expect_consistent_run(4);
}

TEST(CommBench, BadOptionsAreRefused) {
  dist::ParallelConfig p;
  p.tensor_parallel_size = 2;
  CommBenchOptions o;
  o.tokens = {0};
  EXPECT_THROW(run_comm_benchmark(p, Device::CPU, o), Error);
  o.tokens = {1};
  o.iters = 0;
  EXPECT_THROW(run_comm_benchmark(p, Device::CPU, o), Error);
}

}  // namespace
}  // namespace osprey::bench
