// The host side of a CUDA graph step's metadata (engine/cuda_graph_runner.h): which steps a graph
// can replay, the key of the graph that replays them, and the staging of a step's metadata into
// the padded layout the graph was captured over. Pure host code (tested without a GPU).
//
// A graph step of B sequences, each bringing q tokens, all sampled in batch order, is either
//   q = 1       a pure decode (spec_decode false), or
//   q = 1 + k   a speculative verify step (spec_decode true: the known token and k drafts of each
//               sequence, the absorbed attention with s_q = q), 1 ≤ k ≤ kMaxSpeculativeTokens;
// it runs in the bucket Bp = the smallest capture size ≥ B, replaying the graph keyed by (Bp, q).
// The bucket's metadata, in the eager step's layout with Bp sequences of q tokens:
//   token_ids        [Bp·q] I32
//   positions        [Bp·q] I32
//   seq_lens         [Bp] I32
//   query_start_loc  [Bp + 1] I32  = 0, q, 2q, ..., Bp·q   (fixed for the key: written once)
//   req_id_per_token [Bp·q] I32    = t / q                 (once)
//   logits_indices   [Bp·q] I32    = 0 .. Bp·q − 1         (once: every token is sampled)
//   slot_mapping     [Bp·q] I64
//   block_table      [Bp, W] I32
// Real rows [0, B) are the step's own (a row's block-table entries up to its context). Padding
// rows (the shrink-tail rule): a row that was real at the last staging and is padding now gets q
// tokens 0 at positions 0..q−1, seq_len q, slots −1 (the cache writes skip them) and table entry
// 0 = real row 0's first block, so its attention and indexer read cache entries 0..q−1 of that
// block: finite, in bounds, already written (row 0's context covers them: its seq_len ≥ q + 1,
// and q ≤ 4 < the block size). Rows already padding keep their values, but entry 0 follows row
// 0's first block when it moved.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/speculative_config.h"
#include "model/forward_batch.h"

namespace osprey {

// Tokens a sequence brings in a graph step at most: the known token and the largest number of
// drafts --speculative-config allows.
inline constexpr int kMaxGraphTokensPerSeq = 1 + kMaxSpeculativeTokens;

// What a graph is captured for: the padded batch size and the tokens each sequence brings.
struct GraphKey {
  int bucket = 0;
  int tokens_per_seq = 1;
  auto operator<=>(const GraphKey&) const = default;
};

// Why `b` (host metadata) cannot replay a graph, or "" when it can: n_seqs ≥ 1 sequences of q
// tokens each (query_start_loc r·q, max_query_len q), q = 1 a pure decode or 2 ≤ q ≤
// kMaxGraphTokensPerSeq a verify step (spec_decode), every token sampled in order, every context
// at least the step's tokens.
std::string cuda_graph_ineligible(const ForwardBatch& b);
// q of an eligible batch (n_tokens / n_seqs).
int cuda_graph_tokens_per_seq(const ForwardBatch& b);
// The first of `thresholds` (ascending token counts where an op changes kernels:
// ops::cuda::token_path_thresholds) that a step of `real` tokens padded to `padded` would cross
// (real ≤ T < padded), or 0 when none: padding across one would compute the real rows with other
// arithmetic than the eager step, so the graph runner runs such a step eagerly. Decode buckets
// never cross the default thresholds (32 and 128 are capture sizes); verify steps of q tokens a
// sequence can (9 sequences of 3 tokens = 27 padded to 16 × 3 = 48 crosses 32).
int64_t cuda_graph_crossed_threshold(int64_t real, int64_t padded,
                                     const std::vector<int64_t>& thresholds);

// A bucket's host staging: its pieces (laid out as above) and what the last staging left.
struct GraphMetadataHost {
  int size = 0;                         // Bp
  int tokens_per_seq = 1;               // q
  int64_t table_width = 0;              // W
  int32_t* token_ids = nullptr;         // [Bp·q]
  int32_t* positions = nullptr;         // [Bp·q]
  int32_t* seq_lens = nullptr;          // [Bp]
  int32_t* query_start_loc = nullptr;   // [Bp + 1]
  int32_t* req_id_per_token = nullptr;  // [Bp·q]
  int32_t* logits_indices = nullptr;    // [Bp·q]
  int64_t* slot_mapping = nullptr;      // [Bp·q]
  int32_t* block_table = nullptr;       // [Bp, W]
  int prev_real = -1;                   // real rows at the last staging (−1: never staged)
  int32_t pad_block = -1;  // the block padding rows read (row 0's first block at the last staging)
};

// Writes the pieces fixed for the key: query_start_loc, req_id_per_token, logits_indices.
void init_graph_metadata(GraphMetadataHost& m);

// Stages an eligible step `b` of B ≤ m.size sequences of m.tokens_per_seq tokens (host metadata,
// table width ≤ m.table_width) into m under the shrink-tail rule. Returns the padding rows
// rewritten (a reset row, or a row whose entry 0 followed row 0's first block: 1 each).
int64_t stage_graph_metadata(GraphMetadataHost& m, const ForwardBatch& b);

}  // namespace osprey
