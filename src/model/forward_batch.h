// One model step's inputs: the new tokens of every sequence in the batch, their attention
// metadata, and which rows need logits. Built by the engine's step-input builder; the helper below
// builds one from a list of sequences (CLI, tests).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/attention_meta.h"

namespace osprey {

struct ForwardBatch {
  Tensor token_ids;       // [n_tokens] I32
  AttentionMeta attn;     // positions, query_start_loc, seq_lens, block_table, slot_mapping
  Tensor logits_indices;  // [n_logits] I32: rows of the batch whose logits are computed
  int max_query_len = 0;
  // Every sequence brings its one new known token plus draft tokens (a speculative verify step):
  // AttentionPath::Auto takes the absorbed (decode) path although max_query_len > 1.
  bool spec_decode = false;
};

// A sequence's part of one step: `tokens` are appended at positions start_pos...; `blocks` are the
// physical cache blocks of the whole context (enough for start_pos + tokens.size()).
struct SeqStep {
  std::vector<int32_t> tokens;
  int32_t start_pos = 0;
  std::vector<int32_t> blocks;
  bool all_logits = false;  // logits for every new token (else only the last)
  int logit_row = -1;       // without all_logits: the token (index into tokens) whose logits are
                            // computed; −1: the last
};

// Step metadata staging (DeepseekModel::stage_batch): the batch's metadata tensors (token_ids,
// query_start_loc, seq_lens, positions, block_table, slot_mapping, logits_indices,
// req_id_per_token) packed into one buffer of kMetadataAlign-aligned pieces, so that one
// host→device copy moves them all.
constexpr size_t kMetadataAlign = 256;
// Bytes of the packed metadata of b.
size_t packed_metadata_bytes(const ForwardBatch& b);
// Copies b's host metadata into `host` (≥ packed_metadata_bytes(b) bytes) and returns b with each
// metadata tensor pointing at its piece of `dev`, on `device`. An empty tensor moves too (a prompt
// chunk that samples no row has an empty logits_indices, and the CUDA ops check the device of
// every input, empty or not); an absent one (default-constructed: no data, no shape, as
// req_id_per_token in a hand-built batch) stays absent. Fails unless every present tensor is on
// the host.
ForwardBatch pack_metadata(const ForwardBatch& b, void* host, void* dev, Device device);

// Owns the buffers behind a ForwardBatch.
class OwnedBatch {
 public:
  OwnedBatch(const std::vector<SeqStep>& seqs, int block_size);
  const ForwardBatch& batch() const { return batch_; }
  int64_t n_logits() const { return batch_.logits_indices.numel(); }

 private:
  Buffer token_ids_, positions_, qsl_, seq_lens_, block_table_, slots_, req_ids_, logits_indices_;
  ForwardBatch batch_;
};

}  // namespace osprey
