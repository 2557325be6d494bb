// Per-request sampling parameters, in vLLM's meaning (the server maps the OpenAI fields here).
//   temperature 0 = greedy. top_k ≤ 0 = off. top_p 1 = off. min_p 0 = off.
//   repetition_penalty (1 = off): over prompt and output tokens, logit > 0 ? logit / p : logit · p.
//   frequency_penalty / presence_penalty (0 = off): logit −= f · count_in_output + p · [count > 0].
//   seed: the same seed gives the same tokens whatever batch the request runs in.
//   max_tokens: new tokens at most. min_tokens: EOS and stop tokens are suppressed before this.
//   stop_token_ids / stop (strings; the text is cut before the stop string) / ignore_eos.
//   logprobs: −1 none; n ≥ 0 returns the sampled token's logprob and the n most likely
//   alternatives (log-softmax of the raw logits, before penalties and temperature, as vLLM's
//   default raw_logprobs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace osprey {

struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::optional<uint64_t> seed;
  int max_tokens = 16;
  int min_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int logprobs = -1;
  // false: special tokens are part of the text (what a tool-call or reasoning parser reads).
  bool skip_special_tokens = true;

  static constexpr int kMaxLogprobs = 20;
  static constexpr size_t kMaxStopStrings = 16;

  // Throws osprey::Error naming the first invalid field (e.g. "temperature must be in [0, 2]").
  void validate(int vocab_size) const;
};

}  // namespace osprey
