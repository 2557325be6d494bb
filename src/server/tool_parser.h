// Tool calls out of a DeepSeek model's generated text, streamed: text in (in whatever pieces the
// tokens fall), plain content and completed calls out. One parser per choice.
//
//   deepseek_v3   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n
//                 ARGS\n```<｜tool▁call▁end｜>[\n<｜tool▁call▁begin｜>…]<｜tool▁calls▁end｜>
//   deepseek_v31
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>…
//                 <｜tool▁calls▁end｜>
//   deepseek_v32  \n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter
//                 name="K" string="true|false">V</｜DSML｜parameter>…\n</｜DSML｜invoke>…
//                 </｜DSML｜function_calls>   (arguments become {"K": V, …}: a string value when
//                 string="true", else V read as JSON, or as a string when it is not JSON)
//
// Content before the markup streams at once, less a tail that could still begin the markup. A call
// is released when it is complete and well formed (its name, and ARGS a JSON object); a malformed
// call, or markup the output ends inside, is given back as content, byte for byte, from where the
// unreleased markup began. The same parser over the whole text at once gives the same content
// and calls as over any split of it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::server {

enum class ToolCallFormat { kDeepSeekV3, kDeepSeekV31, kDeepSeekV32 };

// vLLM's names: deepseek_v3, deepseek_v31, deepseek_v32.
std::optional<ToolCallFormat> parse_tool_call_format(std::string_view name);
std::string_view tool_call_format_name(ToolCallFormat format);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ToolParseDelta {
  std::string content;
  std::vector<ParsedToolCall> calls;  // completed by this piece, in order
};

class ToolCallParser {
 public:
  explicit ToolCallParser(ToolCallFormat format);

  ToolParseDelta feed(std::string_view text);
  // The output ended: whatever is held back (an unfinished call) comes back as content.
  ToolParseDelta finish();

  // The markup that forces a call when appended to the prompt (tool_choice "required", or a
  // named function when `name` is given): the model continues inside a call.
  static std::string forced_prefix(ToolCallFormat format, const std::string* name);
  // Starts the parser as if it had read `prefix` (a forced_prefix already in the prompt), without
  // giving it back as content.
  void assume_prefix(std::string_view prefix);

  int num_calls() const { return num_calls_; }

 private:
  enum class State { kText, kBlock };
  // Consumes what it can of buf_; `final` at the end of the output.
  void run(ToolParseDelta& out, bool final);
  // Inside a block: parses calls from buf_; false when it needs more text.
  bool step_block(ToolParseDelta& out, bool final);
  void give_back(ToolParseDelta& out);  // the pending markup becomes content
  // Moves the first n bytes of buf_ out (into pending_ when they are markup of a block).
  void consume(size_t n, bool to_pending);
  // Appends text that starts at stream offset `at` to the content, less any assumed prefix.
  void emit(ToolParseDelta& out, size_t at, std::string_view text);

  ToolCallFormat format_;
  State state_ = State::kText;
  std::string buf_;        // text not yet consumed
  std::string pending_;    // consumed markup of the current block since the last released call
  size_t pending_at_ = 0;  // stream offset of pending_[0]
  size_t consumed_ = 0;    // stream offset of buf_[0]
  size_t hidden_end_ = 0;  // stream bytes before this came from an assumed prefix
  bool silent_ = false;    // consuming an assumed prefix: nothing is given back as content
  int num_calls_ = 0;
};

}  // namespace osprey::server
