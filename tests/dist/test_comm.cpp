// The communicator's CPU twins: every collective's values with 1, 2, 4 and 8 ranks (threads over
// shared memory, and processes' protocol over TCP loopback run as threads), and the failure modes:
// a rank that throws, a rank that hangs, ranks out of step — each a CommError naming the rank.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <numeric>
#include <thread>

#include <unistd.h>

#include "dist/tcp_comm.h"
#include "dist/thread_comm.h"

namespace osprey::dist {
namespace {

using Body = std::function<void(Communicator&)>;

// Runs body on every rank; the message of each rank's CommError (empty when it returned).
std::vector<std::string> run_ranks(std::vector<std::unique_ptr<Communicator>>& comms, Body body) {
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> ts;
  for (size_t r = 0; r < comms.size(); ++r)
    ts.emplace_back([&, r] {
      try {
        body(*comms[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        comms[r]->abort(e.what());
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

// Ports of this process: apart from other test processes that ctest runs at the same time, and
// always below 65536 (20000 + 2999·12 + the dozen this process takes).
std::atomic<int> next_port{20000 + int(::getpid() % 3000) * 12};

std::vector<std::unique_ptr<Communicator>> make_group(const std::string& kind, int n,
                                                      double timeout_s) {
  if (kind == "threads") return make_thread_group(n, timeout_s);
  // TCP: every rank connects in its own thread (rank 0 blocks until all joined).
  const int port = next_port++;
  std::vector<std::unique_ptr<Communicator>> out(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      out[size_t(r)] =
          std::make_unique<TcpCommunicator>(TcpEndpoint{"127.0.0.1", port}, r, n, timeout_s);
    });
  for (auto& t : ts) t.join();
  return out;
}

class Collectives : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Collectives, ValuesOnEveryRank) {
  const auto [kind, n] = GetParam();
  auto comms = make_group(kind, n, 20.0);
  const auto errors = run_ranks(comms, [n = n](Communicator& c) {
    const int r = c.rank();
    ASSERT_EQ(c.size(), n);
    // all_reduce: element i of rank r holds r·100 + i; the sum is Σr·100 + n·i.
    Buffer x(DType::F32, {37});
    for (int i = 0; i < 37; ++i) x.f32()[i] = float(r * 100 + i);
    c.all_reduce_sum(x);
    for (int i = 0; i < 37; ++i) ASSERT_EQ(x.f32()[i], float(100 * n * (n - 1) / 2 + n * i));
    // all_gather: rank-major.
    Buffer in(DType::I32, {3}), out(DType::I32, {3 * n});
    for (int i = 0; i < 3; ++i) in.ptr<int32_t>()[i] = r * 10 + i;
    c.all_gather(out, in);
    for (int q = 0; q < n; ++q)
      for (int i = 0; i < 3; ++i) ASSERT_EQ(out.ptr<int32_t>()[q * 3 + i], q * 10 + i);
    // all_to_allv: rank r sends (r + j) % 3 elements to rank j, valued r·1000 + j·10 + k.
    std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) send[size_t(j)] = (r + j) % 3, recv[size_t(j)] = (j + r) % 3;
    const int64_t ns = std::accumulate(send.begin(), send.end(), int64_t(0));
    const int64_t nr = std::accumulate(recv.begin(), recv.end(), int64_t(0));
    Buffer s(DType::F32, {std::max<int64_t>(ns, 1)}), o(DType::F32, {std::max<int64_t>(nr, 1)});
    for (int j = 0, p = 0; j < n; ++j)
      for (int k = 0; k < send[size_t(j)]; ++k) s.f32()[p++] = float(r * 1000 + j * 10 + k);
    c.all_to_allv(o, recv, s, send);
    for (int i = 0, p = 0; i < n; ++i)
      for (int k = 0; k < recv[size_t(i)]; ++k)
        ASSERT_EQ(o.f32()[p++], float(i * 1000 + r * 10 + k));
    // broadcast from the last rank.
    Buffer b(DType::I64, {2});
    b.ptr<int64_t>()[0] = r, b.ptr<int64_t>()[1] = -r;
    c.broadcast(b, n - 1);
    ASSERT_EQ(b.ptr<int64_t>()[0], n - 1);
    ASSERT_EQ(b.ptr<int64_t>()[1], 1 - n);
    c.barrier();
    // broadcast_bytes / all_gather_counts helpers.
    std::vector<uint8_t> bytes;
    if (r == 0) bytes = {1, 2, 3, 250};
    broadcast_bytes(c, bytes, 0);
    ASSERT_EQ(bytes, (std::vector<uint8_t>{1, 2, 3, 250}));
    const auto m = all_gather_counts(c, send);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) ASSERT_EQ(m[size_t(i * n + j)], (i + j) % 3);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives,
                         ::testing::Combine(::testing::Values("threads", "tcp"),
                                            ::testing::Values(1, 2, 4, 8)));

class Failures : public ::testing::TestWithParam<std::string> {};

TEST_P(Failures, ARankThatThrowsIsNamedByItsPeers) {
  auto comms = make_group(GetParam(), 4, 20.0);
  const auto errors = run_ranks(comms, [](Communicator& c) {
    Buffer x(DType::F32, {8});
    for (int i = 0; i < 8; ++i) x.f32()[i] = 1.0f;
    c.all_reduce_sum(x);
    if (c.rank() == 2) throw Error("weights missing on rank 2");
    c.all_reduce_sum(x);
  });
  EXPECT_EQ(errors[2], "weights missing on rank 2");
  for (int r : {0, 1, 3}) {
    EXPECT_NE(errors[size_t(r)].find("rank 2 failed: weights missing on rank 2"), std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
  }
}

TEST_P(Failures, ARankThatHangsIsNamedAfterTheTimeout) {
  auto comms = make_group(GetParam(), 3, 0.5);
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = run_ranks(comms, [](Communicator& c) {
    if (c.rank() == 1) {  // hangs past the timeout, then gives up without a collective
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      return;
    }
    c.barrier();
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 10.0);
  for (int r : {0, 2})
    EXPECT_NE(errors[size_t(r)].find("rank(s) 1 did not reach barrier within 0.5 s"),
              std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
}

TEST_P(Failures, RanksOutOfStepAreAnError) {
  auto comms = make_group(GetParam(), 2, 5.0);
  const auto errors = run_ranks(comms, [](Communicator& c) {
    Buffer x(DType::F32, {4}), g(DType::F32, {8});
    if (c.rank() == 0)
      c.all_reduce_sum(x);
    else
      c.all_gather(g, x);
  });
  for (int r : {0, 1})
    EXPECT_NE(errors[size_t(r)].find("out of step"), std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
}

TEST_P(Failures, MismatchedAllToAllCountsAreAnError) {
  auto comms = make_group(GetParam(), 2, 5.0);
  const auto errors = run_ranks(comms, [](Communicator& c) {
    Buffer s(DType::F32, {4}), o(DType::F32, {4});
    // Rank 0 sends 2 to rank 1, which expects 3.
    std::vector<int64_t> send = {1, 2}, recv = {1, 1};
    if (c.rank() == 1) send = {1, 1}, recv = {3, 1};
    c.all_to_allv(o, recv, s, send);
  });
  for (int r : {0, 1})
    EXPECT_NE(errors[size_t(r)].find("rank 0 sends 2 elements to rank 1, which expects 3"),
              std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
}

INSTANTIATE_TEST_SUITE_P(Backends, Failures, ::testing::Values("threads", "tcp"));

TEST(Tcp, AMissingRankIsNamedAtConnect) {
  try {
    TcpCommunicator c(TcpEndpoint{"127.0.0.1", next_port++}, 0, 3, 0.3);
    FAIL() << "connected without ranks 1 and 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2 did not connect"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace osprey::dist
