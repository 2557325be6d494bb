#include "server/parser_choice.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace osprey::server {

using tokenizer::ChatFormat;

std::optional<ToolCallFormat> default_tool_call_format(ChatFormat format) {
  switch (format) {
    case ChatFormat::kDeepSeekV3:
      return ToolCallFormat::kDeepSeekV3;
    case ChatFormat::kDeepSeekV31:
      return ToolCallFormat::kDeepSeekV31;
    case ChatFormat::kDeepSeekV32:
      return ToolCallFormat::kDeepSeekV32;
    case ChatFormat::kSimple:
      break;
  }
  return std::nullopt;
}

std::optional<ReasoningFormat> default_reasoning_format(ChatFormat format,
                                                        const std::string& chat_template) {
  switch (format) {
    case ChatFormat::kDeepSeekV3:
      if (chat_template.find("<think>") != std::string::npos) return ReasoningFormat::kDeepSeekR1;
      return std::nullopt;
    case ChatFormat::kDeepSeekV31:
    case ChatFormat::kDeepSeekV32:
      return ReasoningFormat::kDeepSeekV3;
    case ChatFormat::kSimple:
      break;
  }
  return std::nullopt;
}

std::string read_chat_template(const std::filesystem::path& model_dir) {
  std::ifstream in(model_dir / "tokenizer_config.json", std::ios::binary);
  if (!in) return "";
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("chat_template") || !j["chat_template"].is_string()) return "";
  return j["chat_template"].get<std::string>();
}

std::optional<ToolCallFormat> choose_tool_call_format(const std::string& flag, ChatFormat format) {
  if (flag == "auto") return default_tool_call_format(format);
  if (flag == "none") return std::nullopt;
  if (auto f = parse_tool_call_format(flag)) return f;
  fail("--tool-call-parser must be auto, none, deepseek_v3, deepseek_v31 or deepseek_v32, got '",
       flag, "'");
}

std::optional<ReasoningFormat> choose_reasoning_format(const std::string& flag, ChatFormat format,
                                                       const std::string& chat_template) {
  if (flag == "auto") return default_reasoning_format(format, chat_template);
  if (flag == "none") return std::nullopt;
  if (auto f = parse_reasoning_format(flag)) return f;
  fail("--reasoning-parser must be auto, none, deepseek_r1 or deepseek_v3, got '", flag, "'");
}

}  // namespace osprey::server
