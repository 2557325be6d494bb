// ops::Fork's streams and events (ops/cuda/stream_fork.h).
#include <array>

#include "ops/cuda/common.cuh"
#include "ops/cuda/stream_fork.h"

namespace osprey::ops::cuda {

namespace {
// Events a thread cycles through: an event is re-recorded only after the wait on its last record
// was issued (stream_after issues both at once), so one would do; a ring keeps the records of a
// step apart for a profiler.
constexpr int kForkEvents = 16;
struct ThreadForkState {
  cudaStream_t side = nullptr;
  std::array<cudaEvent_t, kForkEvents> events{};
  int next = 0;
  ~ThreadForkState() {
    // (at thread exit; errors ignored: the context may be gone at process exit)
    for (cudaEvent_t e : events)
      if (e) cudaEventDestroy(e);
    if (side) cudaStreamDestroy(side);
  }
};
ThreadForkState& state() {
  thread_local ThreadForkState s;
  return s;
}
}  // namespace

void* side_stream() {
  ThreadForkState& s = state();
  if (!s.side) OSPREY_CUDA_CHECK(cudaStreamCreateWithFlags(&s.side, cudaStreamNonBlocking));
  return s.side;
}

void stream_after(void* after, void* before) {
  ThreadForkState& s = state();
  cudaEvent_t& e = s.events[size_t(s.next)];
  s.next = (s.next + 1) % kForkEvents;
  if (!e) OSPREY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  OSPREY_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(before)));
  OSPREY_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(after), e, 0));
}

}  // namespace osprey::ops::cuda
