// The `random` dataset of the serving benchmark: prompts of an exact token count for the served
// tokenizer, made as vLLM's random dataset aims to: random non-special token ids → decode to text
// → re-encode; when the re-encoding has a different length, cut it (too long) or append random
// ids (too short) and go round again, until the text encodes to exactly the target.
//
// Tokens are drawn from the ordinary vocabulary: no added or special tokens, and only tokens
// that decode to valid UTF-8 and encode back to themselves alone (byte fragments of multi-byte
// characters would decode to U+FFFD and make prompts of replacement characters).
//
// Lengths: input and output lengths are drawn uniformly from [len·(1−r), len·(1+r)] (rounded
// outwards), r = range_ratio, independently per request.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace osprey::tokenizer {
class Tokenizer;
}

namespace osprey::bench {

struct RandomDatasetOptions {
  int num_prompts = 0;
  int input_len = 0;
  int output_len = 0;
  double range_ratio = 0;
  uint64_t seed = 0;
  int max_rounds = 32;  // decode/encode rounds before a prompt is accepted as inexact
  int threads = 0;      // 0: hardware concurrency
};

struct DatasetPrompt {
  std::string text;
  int prompt_len = 0;   // target tokens (= the encoded length when exact)
  int encoded_len = 0;  // what the tokenizer gives for `text`
  int output_len = 0;
  int rounds = 0;  // decode/encode rounds it took
};

// Throws osprey::Error for lengths < 1, range_ratio outside [0, 1), or a tokenizer with no
// ordinary tokens. Deterministic for a seed (independent of `threads`).
std::vector<DatasetPrompt> random_prompts(const tokenizer::Tokenizer& tok,
                                          const RandomDatasetOptions& options);

// The token ids prompts are drawn from (see above).
std::vector<int32_t> sampling_candidates(const tokenizer::Tokenizer& tok);

// Without a tokenizer: common English words, one word per token aimed at (most byte-level BPE
// vocabularies have " the", " of", ... as single tokens); lengths are then approximate.
std::vector<DatasetPrompt> random_prompts_approximate(const RandomDatasetOptions& options);

}  // namespace osprey::bench
