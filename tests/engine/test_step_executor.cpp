// The step executor (engine/step_executor.h): jobs run on the worker in order, errors come back
// through wait(), each job is stamped where it ran; a launch after expect_launch() is taken by a
// worker that stayed awake for it (no wake-up through the condition variable), while a launch to a
// sleeping worker without it pays one; without a worker, jobs run inline.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "engine/step_executor.h"

namespace osprey {
namespace {

using Clock = StepExecutor::Clock;

// Polls `f` until it holds or `seconds` pass; whether it held.
template <typename F>
bool eventually(F f, double seconds = 10.0) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(seconds));
  while (!f()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

TEST(StepExecutor, RunsJobsOnTheWorkerInOrderAndRethrows) {
  StepExecutor ex(true);
  ASSERT_TRUE(ex.has_worker());
  std::atomic<int> value{0};
  std::thread::id ran_on;
  for (int i = 1; i <= 5; ++i) {
    ex.launch([&, i] {
      EXPECT_EQ(value.load(), i - 1);  // the previous job is done before this one starts
      value = i;
      ran_on = std::this_thread::get_id();
    });
    EXPECT_TRUE(ex.in_flight());
    ex.wait();
    EXPECT_FALSE(ex.in_flight());
    EXPECT_EQ(value.load(), i);
    EXPECT_LE(ex.started(), ex.finished());
  }
  EXPECT_NE(ran_on, std::this_thread::get_id());
  ex.launch([] { throw std::runtime_error("step failed"); });
  EXPECT_THROW(ex.wait(), std::runtime_error);
  ex.launch([&] { value = 42; });  // usable after an error
  ex.wait();
  EXPECT_EQ(value.load(), 42);
}

TEST(StepExecutor, WithoutAWorkerJobsRunInline) {
  StepExecutor ex(false);
  EXPECT_FALSE(ex.has_worker());
  std::thread::id ran_on;
  ex.expect_launch();  // no-op
  ex.launch([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  ex.wait();
  EXPECT_EQ(ex.sleeping_handovers(), 0);
}

TEST(StepExecutor, ExpectedLaunchFindsTheWorkerAwake) {
  StepExecutor ex(true);
  int runs = 0;
  ex.launch([&] { ++runs; });
  ex.wait();
  // Idle past its spin, the worker sleeps: a plain launch wakes it (one sleeping hand-over).
  ASSERT_TRUE(eventually([&] { return ex.worker_asleep(); }));
  const int64_t h0 = ex.sleeping_handovers();
  ex.launch([&] { ++runs; });
  ex.wait();
  EXPECT_EQ(ex.sleeping_handovers(), h0 + 1);
  // Asleep again; expect_launch wakes it ahead of the launch, which it then takes spinning.
  ASSERT_TRUE(eventually([&] { return ex.worker_asleep(); }));
  ex.expect_launch();
  ASSERT_TRUE(eventually([&] { return !ex.worker_asleep(); }));
  // Awake and spinning for the launch: past its plain spin time it still does not sleep.
  std::this_thread::sleep_for(std::chrono::duration<double>(4 * StepExecutor::kSpinSeconds));
  EXPECT_FALSE(ex.worker_asleep());
  ex.launch([&] { ++runs; });
  ex.wait();
  EXPECT_EQ(ex.sleeping_handovers(), h0 + 1);
  EXPECT_EQ(runs, 3);
  // The launch cleared the expectation: idle again, the worker goes back to sleep.
  EXPECT_TRUE(eventually([&] { return ex.worker_asleep(); }));
}

TEST(StepExecutor, StopsPromptlyWhileExpectingALaunch) {
  const auto t0 = Clock::now();
  {
    StepExecutor ex(true);
    ex.expect_launch();  // never followed by a launch
  }
  // The destructor does not wait out kExpectSeconds.
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(),
            0.5 * StepExecutor::kExpectSeconds);
}

}  // namespace
}  // namespace osprey
