// The step-input (metadata) builder: turns a StepPlan into the ForwardBatch the model reads.
//
// All buffers are persistent, sized once from the budgets (principle 1):
//   token_ids       [max_num_batched_tokens] I32
//   positions       [max_num_batched_tokens] I32
//   slot_mapping    [max_num_batched_tokens] I64
//   req_id_per_token [max_num_batched_tokens] I32 (the batch row of each token)
//   query_start_loc [max_num_seqs + 1] I32
//   seq_lens        [max_num_seqs] I32
//   block_table     [max_num_seqs, max_blocks_per_seq] I32
//   logits_indices  [max_logit_rows] I32 (the sampled rows: one per sampled sequence, 1 + K with
//                   K drafts to verify; max_logit_rows defaults to max_num_seqs)
// Draft tokens (ScheduledSeq::num_draft) come from Sequence::draft. Pending tokens (async
// scheduling: sampled by the step in flight, Sequence::num_pending) get a placeholder id and are
// listed in pending_inputs; the engine writes their ids with set_token once they arrive, before
// the batch runs.
// Each step writes only the live extent; block-table rows are rewritten only where the sequence in
// that row or its block list changed (appended blocks are written alone). When the live extent
// shrinks, the tail that was live last step is reset (token 0, position 0, slot −1, request row 0,
// table row 0), so a kernel that reads a padded batch (CUDA graphs) never sees a stale slot; the
// rest is never filled. The same builder feeds the CPU and CUDA backends (a device copy follows on
// GPU).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/scheduler.h"
#include "model/forward_batch.h"

namespace osprey {

class StepInputs {
 public:
  StepInputs(int max_num_batched_tokens, int max_num_seqs, int max_blocks_per_seq, int block_size,
             int max_logit_rows = 0);

  // The batch for this plan; sample rows follow the plan entries with sample == true in order,
  // 1 + num_draft consecutive rows each (the known token's, then each draft's).
  const ForwardBatch& build(const StepPlan& plan);

  // The tokens of the last build whose ids were not known (pending), in batch order.
  struct PendingInput {
    int token_index;  // into token_ids
    const Sequence* seq;
  };
  const std::vector<PendingInput>& pending_inputs() const { return pending_inputs_; }
  // Writes the id of a pending input of the last build (token_ids[token_index] = id).
  void set_token(int token_index, int32_t id);

  // Counters for tests: block-table entries written by the last build, and tail entries reset.
  int64_t last_table_writes = 0;
  int64_t last_tail_resets = 0;

 private:
  int max_tokens_, max_seqs_, max_blocks_, block_size_, max_logit_rows_;
  Buffer token_ids_, positions_, slot_mapping_, req_id_per_token_, query_start_loc_, seq_lens_,
      block_table_, logits_indices_;
  struct Row {
    uint64_t seq_id = ~0ull;
    uint64_t epoch = 0;
    size_t n_blocks = 0;
  };
  std::vector<Row> rows_;
  std::vector<PendingInput> pending_inputs_;
  int prev_tokens_ = 0, prev_seqs_ = 0;
  ForwardBatch batch_;
};

}  // namespace osprey
