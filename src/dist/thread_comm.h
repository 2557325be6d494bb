// The CPU twin of the communicator within one process: ranks are threads, buffers are host memory,
// and every collective is a rendezvous over shared memory: each rank posts its buffers, waits for
// all (phase 1), reads its peers' buffers directly, waits for all again (phase 2, so nobody changes
// a buffer a peer still reads). Waits end at the group's timeout or when a rank aborts.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace osprey::dist {

class ThreadGroup;

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank);
  int rank() const override { return rank_; }
  int size() const override;
  Device device() const override { return Device::CPU; }
  const char* backend() const override { return "cpu-threads"; }
  void all_reduce_sum(Tensor x) override;
  void all_gather(Tensor out, Tensor in) override;
  void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                   const std::vector<int64_t>& send_counts) override;
  void broadcast(Tensor x, int root) override;
  void barrier() override;
  void abort(const std::string& why) override;

 private:
  std::shared_ptr<ThreadGroup> group_;
  int rank_;
};

// The shared state of n thread ranks. make_thread_group returns one communicator per rank.
std::vector<std::unique_ptr<Communicator>> make_thread_group(
    int n, double timeout_s = comm_timeout_from_env());

}  // namespace osprey::dist
