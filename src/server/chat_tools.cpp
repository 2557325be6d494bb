#include "server/chat_tools.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "server/openai.h"
#include "tokenizer/python_json.h"

namespace osprey::server {

using nlohmann::json;

namespace {

// OpenAI's rule for function names.
constexpr size_t kMaxFunctionName = 64;

bool valid_function_name(const std::string& n) {
  if (n.empty() || n.size() > kMaxFunctionName) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

[[noreturn]] void bad(const std::string& where, const std::string& why, const char* param) {
  throw ApiError(400, "'" + where + "' " + why, param);
}

std::string text_content(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(where, "must be a string or a list of text parts", "messages");
  std::string out;
  for (const json& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad(where, "parts must be {\"type\": \"text\", \"text\": ...}", "messages");
    out += part["text"].get<std::string>();
  }
  return out;
}

}  // namespace

ChatTools parse_chat_tools(const json& body, const std::string* raw_body) {
  ChatTools t;
  const bool has_tools = body.contains("tools") && !body["tools"].is_null();
  if (has_tools) {
    const json& tools = body["tools"];
    if (!tools.is_array()) bad("tools", "must be a list of {\"type\": \"function\", ...}", "tools");
    nlohmann::ordered_json ordered;
    if (raw_body) {
      try {
        ordered = nlohmann::ordered_json::parse(*raw_body)["tools"];
      } catch (const nlohmann::json::exception&) {
        ordered = nlohmann::ordered_json::parse(tools.dump());
      }
    } else {
      ordered = nlohmann::ordered_json::parse(tools.dump());
    }
    std::set<std::string> seen;
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string where = "tools[" + std::to_string(i) + "]";
      const json& x = tools[i];
      if (!x.is_object() || x.value("type", "") != "function")
        bad(where, "must be {\"type\": \"function\", \"function\": {...}}", "tools");
      for (auto it = x.begin(); it != x.end(); ++it)
        if (it.key() != "type" && it.key() != "function")
          bad(where + "." + it.key(), "is not supported", "tools");
      if (!x.contains("function") || !x["function"].is_object())
        bad(where + ".function", "is required (an object with a name)", "tools");
      const json& f = x["function"];
      if (!f.contains("name") || !f["name"].is_string() ||
          !valid_function_name(f["name"].get<std::string>()))
        bad(where + ".function.name",
            "must be a string of 1 to 64 letters, digits, underscores or dashes", "tools");
      for (auto it = f.begin(); it != f.end(); ++it) {
        const std::string& k = it.key();
        if (k == "description" && !it->is_string())
          bad(where + ".function.description", "must be a string", "tools");
        else if (k == "parameters" && !it->is_object())
          bad(where + ".function.parameters", "must be a JSON Schema object", "tools");
        else if (k == "strict" && !it->is_boolean())
          bad(where + ".function.strict", "must be a boolean", "tools");
        else if (k != "name" && k != "description" && k != "parameters" && k != "strict")
          bad(where + ".function." + k, "is not supported", "tools");
      }
      const std::string name = f["name"].get<std::string>();
      if (!seen.insert(name).second)
        bad(where + ".function.name", "repeats '" + name + "'", "tools");
      t.names.push_back(name);
      t.schemas.push_back(tokenizer::python_json_dumps(ordered.at(i).at("function")));
    }
  }
  t.choice = t.names.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const json& c = body["tool_choice"];
    if (c == "none") {
      t.choice = ToolChoice::kNone;
    } else if (c == "auto") {
      if (!t.names.empty()) t.choice = ToolChoice::kAuto;
    } else if (c == "required") {
      if (t.names.empty())
        bad("tool_choice", "is 'required' but no 'tools' are given", "tool_choice");
      t.choice = ToolChoice::kRequired;
    } else if (c.is_object()) {
      if (c.value("type", "") != "function" || !c.contains("function") ||
          !c["function"].is_object() || !c["function"].contains("name") ||
          !c["function"]["name"].is_string())
        bad("tool_choice",
            "must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": "
            "...}}",
            "tool_choice");
      t.named = c["function"]["name"].get<std::string>();
      if (std::find(t.names.begin(), t.names.end(), t.named) == t.names.end())
        bad("tool_choice", "names the function '" + t.named + "', which is not in 'tools'",
            "tool_choice");
      t.choice = ToolChoice::kNamed;
    } else {
      bad("tool_choice",
          "must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
          "tool_choice");
    }
  }
  if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null() &&
      !body["parallel_tool_calls"].is_boolean())
    bad("parallel_tool_calls", "must be a boolean", "parallel_tool_calls");
  return t;
}

std::vector<tokenizer::ChatMessage> parse_api_messages(const json& ms) {
  if (!ms.is_array()) bad("messages", "must be a list of messages", "messages");
  if (ms.empty()) bad("messages", "must not be empty", "messages");
  std::vector<tokenizer::ChatMessage> out;
  for (size_t i = 0; i < ms.size(); ++i) {
    const json& x = ms[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!x.is_object()) bad(where, "must be an object", "messages");
    if (!x.contains("role") || !x["role"].is_string())
      bad(where + ".role", "is required (system, user, assistant or tool)", "messages");
    tokenizer::ChatMessage m;
    m.role = x["role"].get<std::string>();
    if (m.role == "developer") m.role = "system";
    std::set<std::string> allowed = {"role", "content", "name"};
    if (m.role == "assistant")
      allowed.insert({"tool_calls", "reasoning_content", "reasoning", "refusal"});
    else if (m.role == "tool")
      allowed.insert("tool_call_id");
    else if (m.role != "system" && m.role != "user")
      bad(where + ".role", "is '" + m.role + "'; expected system, user, assistant or tool",
          "messages");
    for (auto it = x.begin(); it != x.end(); ++it)
      if (!allowed.count(it.key())) bad(where + "." + it.key(), "is not supported", "messages");
    const bool has_calls = x.contains("tool_calls") && !x["tool_calls"].is_null();
    if (!x.contains("content") || x["content"].is_null()) {
      if (!(m.role == "assistant" && has_calls)) bad(where + ".content", "is required", "messages");
      m.content_is_null = true;
    } else {
      m.content = text_content(x["content"], where + ".content");
    }
    for (const char* k : {"reasoning_content", "reasoning"}) {
      if (!x.contains(k) || x[k].is_null()) continue;
      if (!x[k].is_string()) bad(where + "." + k, "must be a string", "messages");
      if (m.reasoning_content.empty()) m.reasoning_content = x[k].get<std::string>();
    }
    if (m.role == "tool") {
      if (!x.contains("tool_call_id") || !x["tool_call_id"].is_string())
        bad(where + ".tool_call_id", "is required (the id of the call this answers)", "messages");
      m.tool_call_id = x["tool_call_id"].get<std::string>();
    }
    if (has_calls) {
      const json& calls = x["tool_calls"];
      if (!calls.is_array()) bad(where + ".tool_calls", "must be a list", "messages");
      for (size_t c = 0; c < calls.size(); ++c) {
        const std::string w = where + ".tool_calls[" + std::to_string(c) + "]";
        const json& tc = calls[c];
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
          bad(w,
              "must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}",
              "messages");
        const json& f = tc["function"];
        if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
          bad(w + ".function.name", "is required", "messages");
        if (!f.contains("arguments") || !f["arguments"].is_string())
          bad(w + ".function.arguments", "is required (a JSON object as a string)", "messages");
        const std::string args = f["arguments"].get<std::string>();
        if (!json::accept(args) || !json::parse(args).is_object())
          bad(w + ".function.arguments", "must be a JSON object (as a string)", "messages");
        if (tc.contains("type") && tc["type"] != "function")
          bad(w + ".type", "must be 'function'", "messages");
        tokenizer::ChatToolCall call;
        call.id = tc.value("id", "");
        call.name = f["name"].get<std::string>();
        call.arguments = args;
        m.tool_calls.push_back(std::move(call));
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace osprey::server
