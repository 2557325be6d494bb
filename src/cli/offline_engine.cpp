#include "cli/offline_engine.h"

#include <algorithm>

#include "kv/paged_cache.h"

namespace osprey::cli {

EngineConfig offline_engine_config(const ModelConfig& c, int max_num_seqs, int64_t longest_prompt,
                                   int max_tokens) {
  EngineConfig ec;
  ec.max_num_seqs = max_num_seqs;
  ec.max_model_len =
      int(std::min<int64_t>(c.max_position_embeddings, longest_prompt + max_tokens + 1));
  ec.num_blocks = int64_t((ec.max_model_len + kBlockSize - 1) / kBlockSize) * max_num_seqs;
  return ec;
}

}  // namespace osprey::cli
