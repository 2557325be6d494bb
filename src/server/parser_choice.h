// Which tool-call and reasoning parsers a model gets when the command line does not say
// (--tool-call-parser auto / --reasoning-parser auto), from its chat format and template:
//   deepseek-v3   tool calls deepseek_v3; reasoning deepseek_r1 when the template opens <think>
//                 (DeepSeek-R1's), else none
//   deepseek-v3.1 deepseek_v31; deepseek_v3 (thinking when the request asks)
//   deepseek-v3.2 deepseek_v32; deepseek_v3
//   simple        none; none
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "server/reasoning_parser.h"
#include "server/tool_parser.h"
#include "tokenizer/chat.h"

namespace osprey::server {

std::optional<ToolCallFormat> default_tool_call_format(tokenizer::ChatFormat format);
std::optional<ReasoningFormat> default_reasoning_format(tokenizer::ChatFormat format,
                                                        const std::string& chat_template);
// The chat_template string of model_dir/tokenizer_config.json ("" when there is none).
std::string read_chat_template(const std::filesystem::path& model_dir);

// "auto" → the default above, "none" → no parser, else a parser name; throws osprey::Error
// naming the valid values.
std::optional<ToolCallFormat> choose_tool_call_format(const std::string& flag,
                                                      tokenizer::ChatFormat format);
std::optional<ReasoningFormat> choose_reasoning_format(const std::string& flag,
                                                       tokenizer::ChatFormat format,
                                                       const std::string& chat_template);

}  // namespace osprey::server
