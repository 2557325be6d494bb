// The peak memory of a step, taken before the KV cache is sized (vLLM's profile run).
//
// The model's activations live in a workspace arena and the ops keep scratch arenas; both grow on
// the first step that needs more and are then reused. Sizing the KV cache from the memory free
// after loading the weights alone leaves nothing for them: the first long prefill then runs out of
// memory. profile_step_memory runs one forward over the largest step the scheduler can form —
// min(max_num_batched_tokens, max_model_len) new tokens of one sequence whose context ends at
// max_model_len (the widest attention and indexer scores), logits for max_num_seqs rows — on a
// temporary zeroed cache, through each attention path (expanded, then absorbed), so that the
// arenas reach their peak; the memory free afterwards is what the KV cache may take. The expanded
// path's memory grows with the step's Σ seq_lens: the caller bounds it with
// DeepseekModel::set_max_expanded_kv_rows(max_model_len), the context profiled here.
#pragma once

#include "model/deepseek.h"

namespace osprey {

struct StepProfile {
  int64_t tokens = 0;    // new tokens of the profiled step
  int64_t context = 0;   // its sequence's context length after the step
  double seconds = 0.0;  // wall time of the profile forward
};

StepProfile profile_step_memory(const DeepseekModel& model, int max_num_batched_tokens,
                                int max_model_len, int max_num_seqs);

}  // namespace osprey
