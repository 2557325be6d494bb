// The peak memory of a step, taken before the KV cache is sized (vLLM's profile run).
//
// The model's activations live in a workspace arena and the ops keep scratch arenas; both grow on
// the first step that needs more and are then reused. Sizing the KV cache from the memory free
// after loading the weights alone leaves nothing for them: the first long prefill then runs out of
// memory. profile_step_memory runs forwards over the largest steps the scheduler can form, on a
// temporary zeroed cache, so that the arenas reach their peak; the memory free afterwards is what
// the KV cache may take. The absorbed path: max_num_batched_tokens new tokens (at most
// max_num_seqs × max_model_len) over ⌈tokens / max_model_len⌉ sequences whose contexts each end at
// max_model_len (the widest attention and indexer scores), logits for the last max_num_seqs rows.
// The expanded path, whose memory grows with the step's Σ seq_lens (the caller bounds it with
// DeepseekModel::set_max_expanded_kv_rows(max_model_len)): one sequence of
// min(max_num_batched_tokens, max_model_len) new tokens ending at max_model_len.
#pragma once

#include "model/deepseek.h"

namespace osprey {

struct StepProfile {
  int64_t tokens = 0;     // new tokens of the profiled (absorbed) step
  int64_t sequences = 0;  // the sequences they are spread over
  int64_t context = 0;    // each sequence's context length after the step
  double seconds = 0.0;   // wall time of the profile forwards
};

StepProfile profile_step_memory(const DeepseekModel& model, int max_num_batched_tokens,
                                int max_model_len, int max_num_seqs);

}  // namespace osprey
