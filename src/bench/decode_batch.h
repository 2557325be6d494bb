// The paged-attention metadata of a decode batch for the kernel benchmarks (`bench kernels --op
// mla|indexer`): n_seqs sequences at context ctx, s_q query tokens each at the last s_q positions,
// every sequence's blocks shuffled over the cache (so no kernel reads them in order), as host
// buffers and their device copies.
#pragma once

#include <cstdint>
#include <random>

#include "core/device_buffer.h"
#include "core/storage.h"
#include "ops/attention_meta.h"

namespace osprey::bench {

struct DecodeBatch {
  Buffer qsl, seq_lens, positions, block_table;  // [n_seqs + 1], [n_seqs], [n_tokens], [n_seqs, nb]
  DeviceBuffer d_qsl, d_seq_lens, d_positions, d_block_table;
  AttentionMeta host, dev;  // dev: the device copies (no slot mapping, no req_id_per_token)
  int64_t n_tokens = 0, n_blocks = 0;
};

// The batch's metadata; the block shuffle draws from rng (its only use of it). Needs a CUDA device.
DecodeBatch make_decode_batch(int n_seqs, int s_q, int ctx, int block, std::mt19937_64& rng);

}  // namespace osprey::bench
