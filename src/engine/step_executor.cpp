#include "engine/step_executor.h"

#include "core/error.h"

namespace osprey {

StepExecutor::StepExecutor(bool worker) {
  if (worker) worker_ = std::thread([this] { loop(); });
}

StepExecutor::~StepExecutor() {
  if (!worker_.joinable()) return;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !in_flight_ || done_; });
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
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
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = std::move(job);
    done_ = false;
  }
  cv_.notify_all();
}

void StepExecutor::wait() {
  if (!in_flight_) return;
  if (worker_.joinable()) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return done_; });
    started_ = job_started_;
    finished_ = job_finished_;
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
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || job_; });
      if (stop_) return;
      job = std::move(job_);
      job_ = nullptr;
    }
    const Clock::time_point t0 = Clock::now();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    const Clock::time_point t1 = Clock::now();
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_started_ = t0;
      job_finished_ = t1;
      error_ = error;
      done_ = true;
    }
    cv_.notify_all();
  }
}

}  // namespace osprey
