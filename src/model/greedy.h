// The single-sequence paths over the forward pass: prefill logits of every position, and a greedy
// continuation (prefill, then one absorbed decode step per token). Used by `osprey logits`,
// `osprey generate --tokens`, and the golden tests; batched serving goes through src/engine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/deepseek.h"

namespace osprey {

// Reads config.json and the safetensors of `dir` into a CPU model. `config`, when given, replaces
// config.json (e.g. the same weights with another index_topk).
std::unique_ptr<DeepseekModel> load_model_cpu(const std::string& dir,
                                              const ModelConfig* config = nullptr);
// The same on the GPU (weights as load_weights_cuda stores them).
std::unique_ptr<DeepseekModel> load_model_cuda(const std::string& dir,
                                               const ModelConfig* config = nullptr);
// CPU or CUDA by `device`.
std::unique_ptr<DeepseekModel> load_model(const std::string& dir, Device device,
                                          const ModelConfig* config = nullptr);

// logits [tokens.size(), vocab] F32 on the host of every position, from one prefill step (the
// cache on the model's device).
Buffer prefill_logits(const DeepseekModel& m, const std::vector<int32_t>& tokens,
                      const ForwardOptions& opts = {});

struct GreedyOptions {
  int max_new_tokens = 16;
  bool stop_at_eos = true;
  AttentionPath prefill_path = AttentionPath::Auto;
  AttentionPath decode_path = AttentionPath::Auto;
  int prefill_chunk = 0;  // > 0: prefill in chunks of this many tokens
};

// The generated tokens (not including the prompt).
std::vector<int32_t> greedy_generate(const DeepseekModel& m, const std::vector<int32_t>& prompt,
                                     const GreedyOptions& opts);

// Parses "1,2,3" into ids, each checked to be inside [0, vocab).
std::vector<int32_t> parse_token_ids(const std::string& s, int vocab);

}  // namespace osprey
