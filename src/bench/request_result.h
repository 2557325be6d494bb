// What the client measured for one request. Times in seconds on the steady clock; `start` is
// from the beginning of the run, the others from the request's own start (when it was sent).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace osprey::bench {

struct RequestResult {
  bool success = false;
  std::string error;      // why it failed (HTTP status and body, dropped connection, ...)
  int prompt_len = 0;     // planned prompt tokens (the dataset's count)
  int output_len = 0;     // planned output tokens (max_tokens)
  int output_tokens = 0;  // generated tokens: usage.completion_tokens, else content chunks
  std::optional<int> usage_prompt_tokens;      // the server's usage.prompt_tokens, when sent
  std::optional<int> usage_completion_tokens;  // the server's usage.completion_tokens, when sent
  int content_chunks = 0;                      // SSE events that carried generated text
  double start = 0;                            // when it was sent, from the start of the run
  double ttft = 0;                             // to the first chunk with generated text
  double latency = 0;       // to the last chunk with generated text (vLLM's E2EL)
  std::vector<double> itl;  // [content_chunks - 1] gaps between consecutive content chunks
  std::string generated_text;
};

}  // namespace osprey::bench
