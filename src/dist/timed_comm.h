// A communicator that times the collectives it passes on to another (the decorator the engine's
// per-step communication time reads, StepRecord::comm_seconds): the host's wall time from the
// call's entry to its return, summed over every collective (all-reduce, all-gather, all-to-all,
// broadcast, barrier). What that covers, by backend:
//   CPU twins (threads, TCP): the whole collective — the wait for the peers to arrive (skew) and
//     the copies/sums or the socket transfers;
//   NCCL with its watchdog on (how a parallel model runs: no CUDA graphs, no async scheduling):
//     each call waits for the collective's completion on the stream (nccl_comm.h), so the time is
//     the queued GPU work before it + the NCCL kernel + the peers' skew. With the watchdog off it
//     would be the enqueue alone.
// Thread-safe reads: seconds() may be read from another thread than the one that calls.
#pragma once

#include <atomic>
#include <cstdint>

#include "dist/communicator.h"

namespace osprey::dist {

class TimedCommunicator final : public Communicator {
 public:
  explicit TimedCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Device device() const override { return inner_.device(); }
  const char* backend() const override { return inner_.backend(); }

  void all_reduce_sum(Tensor x) override;
  void all_gather(Tensor out, Tensor in) override;
  void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                   const std::vector<int64_t>& send_counts) override;
  void broadcast(Tensor x, int root) override;
  void barrier() override;
  void abort(const std::string& why) override { inner_.abort(why); }

  // Seconds spent inside the collectives so far (monotonic; a caller takes differences).
  double seconds() const { return double(nanos_.load(std::memory_order_relaxed)) * 1e-9; }
  // Collectives passed on so far.
  uint64_t calls() const { return calls_.load(std::memory_order_relaxed); }

 private:
  template <class F>
  void timed(F&& f);
  Communicator& inner_;
  std::atomic<int64_t> nanos_{0};
  std::atomic<uint64_t> calls_{0};
};

}  // namespace osprey::dist
