#include "dist/timed_comm.h"

#include <chrono>

namespace osprey::dist {

template <class F>
void TimedCommunicator::timed(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  // Counted also when the collective throws: the time was spent all the same.
  struct Add {
    TimedCommunicator& c;
    std::chrono::steady_clock::time_point t0;
    ~Add() {
      const auto dt = std::chrono::steady_clock::now() - t0;
      c.nanos_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count(),
                         std::memory_order_relaxed);
      c.calls_.fetch_add(1, std::memory_order_relaxed);
    }
  } add{*this, t0};
  f();
}

void TimedCommunicator::all_reduce_sum(Tensor x) {
  timed([&] { inner_.all_reduce_sum(x); });
}
void TimedCommunicator::all_gather(Tensor out, Tensor in) {
  timed([&] { inner_.all_gather(out, in); });
}
void TimedCommunicator::all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                                    const std::vector<int64_t>& send_counts) {
  timed([&] { inner_.all_to_allv(out, recv_counts, in, send_counts); });
}
void TimedCommunicator::broadcast(Tensor x, int root) {
  timed([&] { inner_.broadcast(x, root); });
}
void TimedCommunicator::barrier() {
  timed([&] { inner_.barrier(); });
}

}  // namespace osprey::dist
