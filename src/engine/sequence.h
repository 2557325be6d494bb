// A request's state inside the engine: its tokens, how many of them are in the KV cache, the
// blocks that hold them, and why it finished.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/sampling_params.h"
#include "kv/block_pool.h"

namespace osprey {

enum class SeqStatus { Waiting, Running, Finished };
enum class FinishReason { None, Length, Stop, Abort };
const char* finish_reason_name(FinishReason r);  // "length", "stop", "abort"

struct Sequence {
  uint64_t id = 0;
  uint64_t arrival = 0;  // submission order (FCFS, and the preemption order: last in, first out)
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  SamplingParams params;
  uint64_t seed = 0;  // the effective sampling seed

  SeqStatus status = SeqStatus::Waiting;
  FinishReason finish = FinishReason::None;
  int32_t stop_token = -1;  // the stop token id that ended it, if any

  int num_computed = 0;           // leading tokens whose KV entries are in the cache
  std::vector<int32_t> blocks;    // physical blocks, in order
  std::vector<BlockHash> hashes;  // prefix hashes of the leading full blocks (cached ones)
  uint64_t blocks_epoch = 0;      // bumped whenever `blocks` changes other than by appending
  int num_prefix_hit_tokens = 0;  // tokens served from the prefix cache at admission
  int num_preemptions = 0;
  // Speculative decoding: the draft tokens proposed for positions num_tokens()... (the MTP
  // layer's greedy guesses), verified by the next step that schedules them.
  std::vector<int32_t> draft;
  // Async scheduling (engine/step_executor.h): tokens sampled by launched steps whose values have
  // not arrived yet. They follow `output` (positions num_known()...) and count in num_tokens(),
  // so the next step can be scheduled while they are sampled; Scheduler::commit appends them.
  int num_pending = 0;

  // Tokens including the pending ones (the length the scheduler plans with).
  int num_tokens() const { return num_known() + num_pending; }
  // Tokens whose values are known: the prompt and the output so far.
  int num_known() const { return int(prompt.size() + output.size()); }
  // The token at position i < num_known().
  int32_t token(int i) const {
    return i < int(prompt.size()) ? prompt[size_t(i)] : output[size_t(i) - prompt.size()];
  }
  bool finished() const { return status == SeqStatus::Finished; }
};

}  // namespace osprey
