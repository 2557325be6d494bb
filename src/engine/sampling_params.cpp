#include "engine/sampling_params.h"

#include "core/error.h"

namespace osprey {

namespace {

// Each check is written so that NaN fails it (every comparison with NaN is false), and each message
// names the field and its allowed range: the server returns it to the client as a 400 error.
void check_range(const char* field, float v, float lo, float hi, bool lo_open = false) {
  const bool above_lo = lo_open ? v > lo : v >= lo;
  if (!(above_lo && v <= hi)) {
    fail(field, " must be a number in ", lo_open ? "(" : "[", lo, ", ", hi, "], got ", v);
  }
}

}  // namespace

void SamplingParams::validate(int vocab_size) const {
  OSPREY_CHECK(vocab_size > 0, "vocab_size ", vocab_size);
  check_range("temperature", temperature, 0.0f, 2.0f);
  check_range("top_p", top_p, 0.0f, 1.0f, /*lo_open=*/true);
  if (top_k < -1 || top_k > vocab_size) {
    fail("top_k must be -1 or 0 (off) or in [1, ", vocab_size, "] (the vocabulary size), got ",
         top_k);
  }
  check_range("min_p", min_p, 0.0f, 1.0f);
  check_range("repetition_penalty", repetition_penalty, 0.0f, 2.0f, /*lo_open=*/true);
  check_range("frequency_penalty", frequency_penalty, -2.0f, 2.0f);
  check_range("presence_penalty", presence_penalty, -2.0f, 2.0f);
  if (max_tokens < 1) fail("max_tokens must be at least 1, got ", max_tokens);
  if (min_tokens < 0 || min_tokens > max_tokens) {
    fail("min_tokens must be in [0, max_tokens=", max_tokens, "], got ", min_tokens);
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    const int32_t id = stop_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      fail("stop_token_ids[", i, "] must be a token id in [0, ", vocab_size, "), got ", id);
    }
  }
  if (stop.size() > kMaxStopStrings) {
    fail("stop may hold at most ", kMaxStopStrings, " strings, got ", stop.size());
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) fail("stop[", i, "] must be a non-empty string");
  }
  if (logprobs < -1 || logprobs > kMaxLogprobs) {
    fail("logprobs must be in [-1, ", kMaxLogprobs, "] (-1 = none), got ", logprobs);
  }
}

}  // namespace osprey
