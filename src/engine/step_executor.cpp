#include "engine/step_executor.h"

#include "core/error.h"

namespace osprey {

StepExecutor::StepExecutor(bool worker) {
  if (worker) worker_ = std::thread([this] { loop(); });
}

StepExecutor::~StepExecutor() {
  if (!worker_.joinable()) return;
  if (in_flight_) {
    try {
      wait();
    } catch (...) {  // the engine is going away: nothing can use the error
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

bool StepExecutor::spin_for(State want) const {
  const Clock::time_point until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(kSpinSeconds));
  while (state_.load() != want) {
    if (Clock::now() >= until) return false;
    std::this_thread::yield();
  }
  return true;
}

bool StepExecutor::expecting() const {
  const int64_t until = expect_until_.load();
  return until != 0 && Clock::now().time_since_epoch().count() < until;
}

void StepExecutor::expect_launch() {
  if (!worker_.joinable()) return;
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(kExpectSeconds));
  expect_until_.store(until.time_since_epoch().count());
  // The worker either sees the deadline before it sleeps, or has said it sleeps (seq_cst order).
  if (worker_sleeping_.load()) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }
}

bool StepExecutor::wait_for_job() {
  for (;;) {
    const Clock::time_point until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(kSpinSeconds));
    while (state_.load() != kPosted) {
      if (stop_.load()) return false;
      if (Clock::now() >= until && !expecting()) break;
      std::this_thread::yield();
    }
    if (state_.load() == kPosted) return true;
    std::unique_lock<std::mutex> lk(mu_);
    worker_sleeping_.store(true);
    cv_.wait(lk, [&] { return stop_.load() || state_.load() == kPosted || expecting(); });
    worker_sleeping_.store(false);
    if (stop_.load()) return false;
    if (state_.load() == kPosted) {
      ++sleeping_handovers_;
      return true;
    }
    // Woken by expect_launch(): spin for the launch.
  }
}

void StepExecutor::launch(std::function<void()> job) {
  OSPREY_CHECK(!in_flight_, "a step is already in flight");
  in_flight_ = true;
  if (!worker_.joinable()) {
    started_ = Clock::now();
    try {
      job();
    } catch (...) {
      error_ = std::current_exception();
    }
    finished_ = Clock::now();
    return;
  }
  job_ = std::move(job);
  expect_until_.store(0);
  state_.store(kPosted);
  // The worker either sees kPosted before it sleeps, or has said it sleeps (seq_cst order).
  if (worker_sleeping_.load()) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }
}

void StepExecutor::wait() {
  if (!in_flight_) return;
  if (worker_.joinable()) {
    if (!spin_for(kDone)) {
      std::unique_lock<std::mutex> lk(mu_);
      engine_sleeping_.store(true);
      cv_.wait(lk, [&] { return state_.load() == kDone; });
      engine_sleeping_.store(false);
    }
    started_ = job_started_;
    finished_ = job_finished_;
    state_.store(kIdle);
  }
  in_flight_ = false;
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void StepExecutor::loop() {
  for (;;) {
    if (!wait_for_job()) return;
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    const Clock::time_point t0 = Clock::now();
    try {
      job();
    } catch (...) {
      error_ = std::current_exception();
    }
    job_started_ = t0;
    job_finished_ = Clock::now();
    state_.store(kDone);
    if (engine_sleeping_.load()) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_.notify_all();
    }
  }
}

}  // namespace osprey
