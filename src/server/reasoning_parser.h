// Reasoning out of a DeepSeek model's generated text, streamed: text in (in whatever pieces the
// tokens fall), reasoning and content out. One parser per choice.
//
//   deepseek_r1  the output is reasoning up to </think> (a leading <think> is dropped), content
//                after it; an output that never closes its thinking is all reasoning (R1's
//                template opens <think> in the prompt, so the model may not write it).
//   deepseek_v3  as deepseek_r1 when the request turned thinking on (chat_template_kwargs
//                thinking / enable_thinking: V3.1 and V3.2 open <think> in the prompt), else
//                everything is content.
// (vLLM's names and meaning.) A tail that could still become a tag is held back until it is known.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace osprey::server {

enum class ReasoningFormat { kDeepSeekR1, kDeepSeekV3 };

std::optional<ReasoningFormat> parse_reasoning_format(std::string_view name);
std::string_view reasoning_format_name(ReasoningFormat format);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  ReasoningParser(ReasoningFormat format, bool thinking);

  ReasoningDelta feed(std::string_view text);
  ReasoningDelta finish();  // releases a held-back tail
  // Whether this request's output has a reasoning part at all (deepseek_v3 without thinking: no).
  bool active() const { return active_; }

 private:
  enum class State { kStart, kReasoning, kContent };
  void run(ReasoningDelta& out, bool final);

  State state_;
  std::string buf_;
  bool active_;
};

}  // namespace osprey::server
