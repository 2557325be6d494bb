// The per-step attention metadata every attention-like op reads (built once per step).
//   query_start_loc [n_seqs + 1] I32: tokens of sequence s are rows [qsl[s], qsl[s+1]) of the batch
//   seq_lens        [n_seqs] I32: context length of s after this step (cached + new tokens)
//   positions       [n_tokens] I32: position of each token in its sequence; token t of s attends to
//                   context positions 0..positions[t] (causal)
//   block_table     [n_seqs, max_blocks] I32: physical block of each 64-token logical block
//   slot_mapping    [n_tokens] I64: cache slot (block · block_size + offset) each new token writes
//   req_id_per_token [n_tokens] I32: the batch row (sequence) of each token, so a kernel over
//                   tokens finds its sequence without searching query_start_loc
//   fingerprint     what the attention's split-KV work plan depends on, hashed once per step on
//                   the host (attention_fingerprint below); 0 = unknown, plans are rebuilt
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace osprey {

struct AttentionMeta {
  int n_seqs = 0;
  int n_tokens = 0;
  int block_size = 64;
  Tensor query_start_loc;
  Tensor seq_lens;
  Tensor positions;
  Tensor block_table;
  Tensor slot_mapping;
  Tensor req_id_per_token;
  uint64_t fingerprint = 0;
};

// The batch fingerprint of vLLM's V3.2 metadata cache: n_tokens, the maximum query length and
// every token's attended length min(positions[t] + 1, clamp) in order (clamp = the attention's
// top-k, or INT32_MAX for dense attention). Read from host positions and query_start_loc; never 0.
uint64_t attention_fingerprint(const AttentionMeta& host_meta, int64_t clamp);

}  // namespace osprey
