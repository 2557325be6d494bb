// The engine of an offline run (generate, eval): a known set of prompts, so the KV cache is sized
// to exactly what they need rather than to a memory budget.
#pragma once

#include <cstdint>

#include "config/model_config.h"
#include "engine/engine.h"

namespace osprey::cli {

// An engine config for `max_num_seqs` sequences at once, each at most `longest_prompt` +
// `max_tokens` tokens (+ 1, capped at the model's max_position_embeddings): max_num_seqs,
// max_model_len and num_blocks (max_model_len in blocks, for every sequence) set; the rest default.
EngineConfig offline_engine_config(const ModelConfig& c, int max_num_seqs, int64_t longest_prompt,
                                   int max_tokens);

}  // namespace osprey::cli
