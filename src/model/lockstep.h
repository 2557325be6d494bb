// Ranks stepping in lockstep: the engine, scheduler and server run once (rank 0); every model step
// rank 0 runs is first published to the other ranks over a host communicator (the control plane),
// and each of them runs the same step on its shard, so their collectives meet rank 0's.
//
// A published step carries the batch (token ids, attention metadata, logits rows) and what rank 0's
// model is set to (attention path, expanded-path bound, cache formats, ablations), and names rank
// 0's cache (address, blocks, formats): each rank keeps a cache of its own per name, so a rank 0
// that alternates caches (tests, the engine's profile step) finds the same contents on every rank.
#pragma once

#include <map>
#include <tuple>

#include "dist/communicator.h"
#include "model/deepseek.h"

namespace osprey {

class StepPublisher {
 public:
  explicit StepPublisher(dist::Communicator& control) : control_(control) {}
  // Rank 0: sends the step (a host copy of b's metadata) to every other rank.
  void publish(const DeepseekModel& m, const ForwardBatch& b, const PagedKVCache& cache,
               const ForwardOptions& o);
  // Rank 0: ends the other ranks' loops.
  void stop();

 private:
  dist::Communicator& control_;
  bool stopped_ = false;
};

// Ranks 1..: runs every step rank 0 publishes until it stops; a failure is thrown (the caller
// aborts the communicators so that rank 0 names this rank).
void run_lockstep_worker(DeepseekModel& m, dist::Communicator& control);

}  // namespace osprey
