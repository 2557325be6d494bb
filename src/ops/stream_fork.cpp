#include "ops/stream_fork.h"

#include <cstdlib>

#ifdef OSPREY_WITH_CUDA
#include "core/device_buffer.h"
#include "ops/cuda/stream_fork.h"
#endif

namespace osprey::ops {

namespace {
bool g_fork = [] {
  const char* e = std::getenv("OSPREY_STREAM_FORK");
  return !(e && e[0] == '0');
}();
}  // namespace

bool stream_fork_enabled() {
  return g_fork;
}
bool set_stream_fork(bool on) {
  const bool was = g_fork;
  g_fork = on;
  return was;
}

#ifdef OSPREY_WITH_CUDA
Fork::Fork(Device device, bool enabled) {
  active_ = enabled && g_fork && device == Device::CUDA;
  if (!active_) return;
  main_ = osprey::cuda::current_stream();
  side_ = cuda::side_stream();
  cuda::stream_after(side_, main_);  // the side starts after what the main stream has issued
}
Fork::~Fork() {
  // A safety net: callers join where the side's results are read. Here (also while an op's error
  // unwinds the step) a failing join must not end the process: a CUDA error is sticky, and the
  // next CUDA call reports it.
  try {
    join();
  } catch (...) {
  }
}
Fork::Side::Side(Fork* fork) : fork_(fork) {
  if (!fork_) return;
  fork_->pending_ = true;
  prev_stream_ = osprey::cuda::exchange_current_stream(fork_->side_);
  prev_lane_ = cuda::set_scratch_lane(1);
}
Fork::Side::~Side() {
  if (!fork_) return;
  osprey::cuda::exchange_current_stream(prev_stream_);
  cuda::set_scratch_lane(prev_lane_);
}
Fork::Side Fork::side() {
  return Side(active_ ? this : nullptr);
}
void Fork::join() {
  if (!active_ || !pending_) return;
  cuda::stream_after(main_, side_);
  pending_ = false;
}
#else
// No CUDA: never active (the fields are those of the CUDA build, untouched here).
Fork::Fork(Device, bool) {
  (void)pending_, (void)main_, (void)side_;
}
Fork::~Fork() = default;
Fork::Side::Side(Fork* fork) : fork_(fork) {
  (void)fork_, (void)prev_stream_, (void)prev_lane_;
}
Fork::Side::~Side() = default;
Fork::Side Fork::side() {
  return Side(nullptr);
}
void Fork::join() {}
#endif

}  // namespace osprey::ops
