// Two branches of one step's work (CUDA): ops issued inside a Fork's side scope run on a second
// stream, after everything this thread issued on its stream before the Fork was made, and the
// thread's stream waits for them at join(). Inside a CUDA graph capture the fork and the join are
// edges of the graph (two branches of kernels that may run at once); outside, two events. Side ops
// take their scratch from their own lane (ops/cuda/common.cuh scratch_lane 1), so ops running at
// once never share a scratch buffer. Buffers a side op reads or writes must stay allocated until
// the join (the caller's workspace scope). On the CPU, with the fork switched off
// (OSPREY_STREAM_FORK=0 or set_stream_fork), or in a build without CUDA, every call is a no-op: the
// ops run in the order issued, the same values (bit for bit on CUDA too: test_cuda_graph_step
// StreamForkChangesNoByte). On by default: the dsv32 B = 1 graph step 2.33 → 2.28 ms (H100,
// bench/RESULTS.md run 18).
#pragma once

#include "core/tensor.h"

namespace osprey::ops {

// Whether forks on CUDA are taken (default on; OSPREY_STREAM_FORK=0 read once). set_stream_fork
// switches it for A/B runs and tests, returning the previous setting; a captured graph keeps the
// branches it was captured with.
bool stream_fork_enabled();
bool set_stream_fork(bool on);

class Fork {
 public:
  // Inactive on the CPU, with `enabled` false or the fork switched off.
  explicit Fork(Device device, bool enabled = true);
  ~Fork();  // joins if the side was used and not joined (errors swallowed: call join())
  Fork(const Fork&) = delete;
  Fork& operator=(const Fork&) = delete;

  // While a Side lives, this thread's ops go to the fork's side stream and scratch lane.
  class Side {
   public:
    ~Side();
    Side(const Side&) = delete;
    Side& operator=(const Side&) = delete;

   private:
    friend class Fork;
    explicit Side(Fork* fork);
    Fork* fork_;  // null: inactive
    void* prev_stream_ = nullptr;
    int prev_lane_ = 0;
  };
  Side side();
  // The thread's stream waits for everything issued on the side so far (idempotent until the side
  // is used again).
  void join();
  bool active() const { return active_; }

 private:
  bool active_ = false;
  bool pending_ = false;  // side work issued and not yet joined
  void* main_ = nullptr;  // cudaStream_t of the thread when the fork was made
  void* side_ = nullptr;  // cudaStream_t of the side
};

}  // namespace osprey::ops
