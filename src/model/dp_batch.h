// Attention data parallelism: the part of a step's batch that one rank runs. A sequence belongs
// to rank (its first cache block) mod world: stable for the sequence's life (its blocks stay its
// own), and a prefix shared from the first block lands where that block's contents already are.
// Every rank derives the same partition from the same published batch, so each knows how many
// logits rows every other rank returns.
#pragma once

#include <vector>

#include "core/storage.h"
#include "dist/communicator.h"
#include "model/forward_batch.h"

namespace osprey {

class DpBatch {
 public:
  DpBatch(const ForwardBatch& full, int rank, int world);
  const ForwardBatch& batch() const { return batch_; }
  int64_t n_logits() const { return int64_t(global_row_.size()); }
  // logits [full n_logits, V] (any device) = the local logits [n_logits(), V] of every rank,
  // each row where the full batch has it (an all_gather over `comm`, padded to the largest part).
  void gather_logits(dist::Communicator& comm, Tensor local, Tensor logits, Workspace& ws) const;

 private:
  int world_;
  int64_t full_logits_ = 0;
  std::vector<int64_t> rows_per_rank_;  // [world] logits rows of each rank
  std::vector<int32_t> source_row_;     // [full n_logits] row in the gathered [world · max, V]
  std::vector<int64_t> global_row_;     // [n_logits()] this rank's rows in the full batch
  Buffer token_ids_, positions_, qsl_, seq_lens_, block_table_, slots_, req_ids_, logits_indices_;
  ForwardBatch batch_;
};

}  // namespace osprey
