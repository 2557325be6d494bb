// The step executor: where a model step's device work runs, so the engine thread can schedule and
// build the next step meanwhile (async scheduling, engine/engine.h).
//
// One job at a time: launch() hands it over and returns; wait() blocks until it is done and
// rethrows what it threw. With a worker (async scheduling) the job runs on the executor's own
// thread, the same control flow on both backends: on the CPU the forward computes there; on CUDA
// it enqueues its kernels there (the legacy default stream orders them with the engine thread's
// sampling). Without one (synchronous engine) launch() runs the job inline.
// Each job's start and end are stamped (steady_clock) where it runs: the engine's measure of the
// device's busy time and of its idle gap between steps.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace osprey {

class StepExecutor {
 public:
  using Clock = std::chrono::steady_clock;

  explicit StepExecutor(bool worker);
  ~StepExecutor();  // waits for the job in flight (its error, if any, is dropped)
  StepExecutor(const StepExecutor&) = delete;
  StepExecutor& operator=(const StepExecutor&) = delete;

  // Runs `job` (on the worker, or now); the previous job must have been waited for.
  void launch(std::function<void()> job);
  // Blocks until the launched job is done; rethrows its exception. No-op when none is in flight.
  void wait();
  bool in_flight() const { return in_flight_; }
  bool has_worker() const { return worker_.joinable(); }

  // The last waited-for job's start and end, stamped where it ran.
  Clock::time_point started() const { return started_; }
  Clock::time_point finished() const { return finished_; }

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;  // the job handed to the worker, until it takes it
  bool done_ = false;          // the worker finished the job in flight
  bool stop_ = false;
  std::exception_ptr error_;
  Clock::time_point job_started_, job_finished_;  // written by the worker under mu_
  bool in_flight_ = false;                        // engine thread only
  Clock::time_point started_, finished_;          // engine thread only
  std::thread worker_;                            // last: starts after the state above exists
};

}  // namespace osprey
