// The step executor: where a model step's device work runs, so the engine thread can schedule and
// build the next step meanwhile (async scheduling, engine/engine.h).
//
// One job at a time: launch() hands it over and returns; wait() blocks until it is done and
// rethrows what it threw. With a worker (async scheduling) the job runs on the executor's own
// thread, the same control flow on both backends: on the CPU the forward computes there; on CUDA
// it enqueues its kernels there (the legacy default stream orders them with the engine thread's
// sampling). Without one (synchronous engine) launch() runs the job inline.
// The hand-over costs the device's idle gap between steps, so each side spins a short while
// (kSpinSeconds) before it sleeps on the condition variable: a job launched, or a job done, within
// that time is seen without a wake-up through the kernel. On CUDA a job only enqueues the step's
// kernels: it ends long before the device does, and the next job comes a device step later (ms),
// so the worker is asleep by then and every launch paid a wake-up (the H200's engine loop at B=1:
// a 44 µs idle gap async against 12 µs synchronous). expect_launch() says a launch will come soon
// (the engine calls it once it has built the next step, before it waits for this one's ids): the
// worker is woken now if it sleeps and spins until the launch (at most kExpectSeconds), so the
// wake-up overlaps the device's work instead of following it.
// Each job's start and end are stamped (steady_clock) where it runs: the engine's measure of the
// device's busy time and of its idle gap between steps.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace osprey {

class StepExecutor {
 public:
  using Clock = std::chrono::steady_clock;
  // How long a side spins for the other before it sleeps: longer than a hand-over between steps
  // (the engine thread's sampling of a step), short enough to cost little on a busy machine.
  static constexpr double kSpinSeconds = 200e-6;
  // How long the worker spins for a launch after expect_launch(): longer than any step (a long
  // prefill chunk), so it sleeps again only when the engine stopped launching (an error).
  static constexpr double kExpectSeconds = 1.0;

  explicit StepExecutor(bool worker);
  ~StepExecutor();  // waits for the job in flight (its error, if any, is dropped)
  StepExecutor(const StepExecutor&) = delete;
  StepExecutor& operator=(const StepExecutor&) = delete;

  // Runs `job` (on the worker, or now); the previous job must have been waited for.
  void launch(std::function<void()> job);
  // Blocks until the launched job is done; rethrows its exception. No-op when none is in flight.
  void wait();
  // A launch() follows soon: the worker stays awake (spinning) for it. No-op without a worker.
  void expect_launch();
  // Jobs the worker took after sleeping on the condition variable (each paid a wake-up).
  int64_t sleeping_handovers() const { return sleeping_handovers_.load(); }
  bool worker_asleep() const { return worker_sleeping_.load(); }
  bool in_flight() const { return in_flight_; }
  bool has_worker() const { return worker_.joinable(); }

  // The last waited-for job's start and end, stamped where it ran.
  Clock::time_point started() const { return started_; }
  Clock::time_point finished() const { return finished_; }

 private:
  void loop();

  enum State { kIdle, kPosted, kDone };
  // Spins up to kSpinSeconds for state_ == want; false if it did not come.
  bool spin_for(State want) const;
  // The worker's wait for a job: spins (longer while a launch is expected), then sleeps; false
  // when the executor stops.
  bool wait_for_job();
  bool expecting() const;

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> state_{kIdle};  // kPosted: job_ is the worker's; kDone: the results are ours
  std::atomic<bool> worker_sleeping_{false}, engine_sleeping_{false};
  std::atomic<bool> stop_{false};
  // expect_launch()'s deadline (Clock ticks since its epoch; 0: none), cleared by launch().
  std::atomic<int64_t> expect_until_{0};
  std::atomic<int64_t> sleeping_handovers_{0};
  std::function<void()> job_;  // handed over by state_ (written before kPosted, read after)
  std::exception_ptr error_;   // the worker's, published by kDone
  Clock::time_point job_started_, job_finished_;  // the worker's, published by kDone
  bool in_flight_ = false;                        // engine thread only
  Clock::time_point started_, finished_;          // engine thread only
  std::thread worker_;                            // last: starts after the state above exists
};

}  // namespace osprey
