// The MTP drafter: DeepSeek's multi-token-prediction layer proposing draft tokens for the
// engine's verify steps (engine/spec_verify.h; model: DeepseekModel::forward_mtp).
//
// The MTP layer has its own cache layer, indexed like the main layers: its entry at position p
// is computed from the main model's hidden state at p and the token at p + 1, so it exists only
// once both are known. Each engine step therefore runs, around the main forward:
//   catch_up (after sampling, before commit): the MTP layer over every position whose main
//     entry the step keeps (a prompt chunk's tokens; a verify's known token and accepted drafts),
//     with the main hidden states of those rows; the output at a sampled sequence's last kept
//     position gives its first draft d_1 (argmax: greedy drafts) and the MTP hidden state there.
//   extend (next step, after scheduling allocated the blocks): drafts d_2..d_k, each one MTP
//     step at the next position from the previous step's MTP hidden state and draft token (the
//     layer reused, as vLLM and SGLang run DeepSeek's single MTP layer for k > 1).
// The entries extend writes beyond the last kept position are rewritten by the next catch_up
// before any later step reads them (positions are always written before they are attended).
//
// Both run eagerly, also with CUDA graphs on (the main step's verify and decode forwards are
// replayed: engine/cuda_graph_runner.h): catch_up's batch is ragged (a prompt chunk, or 1 + the
// accepted drafts of each sequence), and forward_mtp reads host positions (the embedding zeroed
// at position 0) and allocates its outputs per call; extend's steps (one token a sequence, K ≥ 2
// only) would fit a graph once forward_mtp takes a device batch and persistent buffers.
// Buffers (on the model's device):
//   main_hidden_  [max_num_batched_tokens, D] F32: the main step's final-normed hidden states
//   state_        [max_num_seqs, D] F32: per running sequence (a slot), the MTP hidden state at
//                 its last kept position (what extend's first step reads); only when K ≥ 2
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "core/storage.h"
#include "engine/sampler.h"
#include "engine/sequence.h"
#include "kv/paged_cache.h"
#include "model/deepseek.h"

namespace osprey {

class MtpDrafter {
 public:
  MtpDrafter(const DeepseekModel& model, int num_speculative_tokens, int max_num_batched_tokens,
             int max_num_seqs);

  // [n_tokens, D] on the model's device: ForwardOptions::hidden_out of the main step.
  Tensor main_hidden(int64_t n_tokens) const;
  // The whole buffer [max_num_batched_tokens, D] (a CUDA graph step writes its padded rows too).
  Tensor main_hidden_buffer() const { return main_hidden_.view(); }

  // One sequence's part of catch_up: positions [start, start + next_tokens.size()) were kept by
  // the main step, whose hidden states are main_hidden rows [row, row + next_tokens.size());
  // next_tokens[i] is the token at start + i + 1. propose: the sequence samples (its last kept
  // position gets a draft).
  struct Kept {
    const Sequence* seq = nullptr;
    int start = 0;
    int row = 0;
    std::vector<int32_t> next_tokens;
    bool propose = false;
  };
  // Returns d_1 for each entry with propose (−1 for the others), in order.
  std::vector<int32_t> catch_up(const std::vector<Kept>& kept, PagedKVCache& cache);

  // Lengthens each seqs[i]->draft (holding d_1 from catch_up) to want[i] tokens.
  void extend(const std::vector<Sequence*>& seqs, const std::vector<int>& want,
              PagedKVCache& cache);

  // A sequence that is done (or preempted) gives its state slot back.
  void release(const Sequence& seq);

 private:
  int slot_of(const Sequence& seq);
  // Greedy tokens of logits [n, V] (the drafts: q is one-hot).
  std::vector<int32_t> argmax(Tensor logits);
  Tensor device_indices(const std::vector<int32_t>& idx);  // [n] I32 on the model's device

  const DeepseekModel& model_;
  int k_;
  Storage main_hidden_;            // [max_num_batched_tokens, D]
  Storage state_;                  // [max_num_seqs, D] (K ≥ 2)
  std::map<uint64_t, int> slots_;  // Sequence::arrival → row of state_
  std::vector<int> free_slots_;
  Storage index_host_, index_dev_;  // [capacity] I32 staging for row gathers
  Sampler greedy_;
  SamplingParams greedy_params_;
  std::vector<int32_t> no_tokens_;
};

}  // namespace osprey
