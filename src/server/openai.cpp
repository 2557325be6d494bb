#include "server/openai.h"

#include <cmath>
#include <cstdint>
#include <set>

#include "core/error.h"
#include "server/chat_tools.h"

namespace osprey::server {

using nlohmann::json;

namespace {
// Requests nest a few levels (messages[i].content[j].text); 64 leaves room for any real client.
constexpr int kMaxJsonDepth = 64;
}  // namespace

std::string ApiError::type() const {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 413:
      return "invalid_request_error";
    case 503:
      return "server_overloaded";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string ApiError::json() const {
  nlohmann::json e = {{"message", what()},
                      {"type", type()},
                      {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                      {"code", status}};
  return nlohmann::json{{"error", e}}.dump();
}

json parse_body(const std::string& body) {
  if (body.empty()) throw ApiError(400, "the request body is empty; send a JSON object");
  json j;
  try {
    // Deeper nesting than any request needs is refused while parsing: nothing later (an error
    // message that prints a value) has to walk a pathological tree.
    j = json::parse(body, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth)
        throw ApiError(400, "the request body nests JSON deeper than " +
                                std::to_string(kMaxJsonDepth) + " levels");
      return true;
    });
  } catch (const json::parse_error& e) {
    const std::string what = e.what();
    if (what.find("UTF-8") != std::string::npos || what.find("utf-8") != std::string::npos)
      throw ApiError(400,
                     "the request body is not valid UTF-8 (byte " + std::to_string(e.byte) + ")");
    throw ApiError(400, "the request body is not valid JSON: " + what);
  } catch (const json::exception& e) {
    // Not a syntax error but still no JSON value a request can hold, e.g. a number beyond the
    // range of a double (1e999: out_of_range.406).
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

namespace {

// Typed access to the request's fields; every error names the field.
class Fields {
 public:
  Fields(const json& j, std::set<std::string> allowed) : j_(j) {
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!allowed.count(it.key()))
        throw ApiError(400, "unrecognized request argument '" + it.key() + "'", it.key());
  }
  bool has(const char* k) const { return j_.contains(k) && !j_.at(k).is_null(); }
  const json& at(const char* k) const { return j_.at(k); }
  [[noreturn]] void bad(const char* k, const std::string& why) const {
    throw ApiError(400, std::string("'") + k + "' " + why, k);
  }
  bool boolean(const char* k, bool d) const {
    if (!has(k)) return d;
    if (!at(k).is_boolean()) bad(k, "must be a boolean");
    return at(k).get<bool>();
  }
  int64_t integer(const char* k, int64_t d) const {
    if (!has(k)) return d;
    const json& v = at(k);
    if (!v.is_number_integer()) bad(k, "must be an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      bad(k, "must be an integer in [" + std::to_string(INT64_MIN) + ", " +
                 std::to_string(INT64_MAX) + "], got " + v.dump());
    return v.get<int64_t>();
  }
  // An integer in [lo, hi]; the message gives the range and the value sent.
  int64_t integer_in(const char* k, int64_t d, int64_t lo, int64_t hi) const {
    const int64_t v = integer(k, d);
    if (v < lo || v > hi)
      bad(k, "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                 "], got " + std::to_string(v));
    return v;
  }
  double number(const char* k, double d) const {
    if (!has(k)) return d;
    const json& v = at(k);
    if (!v.is_number()) bad(k, "must be a number");
    return v.get<double>();
  }
  // A number in [lo, hi] (or (lo, hi] when lo_open), checked before it is narrowed to float.
  float number_in(const char* k, double d, double lo, double hi, bool lo_open = false) const {
    const double v = number(k, d);
    if (!((lo_open ? v > lo : v >= lo) && v <= hi))
      bad(k, "must be a number in " + std::string(lo_open ? "(" : "[") + fmt(lo) + ", " + fmt(hi) +
                 "], got " + at(k).dump());
    return float(v);
  }
  static std::string fmt(double x) {
    json j = x;
    return j.dump();
  }
  std::string string(const char* k, const std::string& d) const {
    if (!has(k)) return d;
    if (!at(k).is_string()) bad(k, "must be a string");
    return at(k).get<std::string>();
  }

 private:
  const json& j_;
};

const std::set<std::string> kCommon = {"model",
                                       "max_tokens",
                                       "temperature",
                                       "top_p",
                                       "n",
                                       "stream",
                                       "stream_options",
                                       "stop",
                                       "seed",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "user",
                                       "logit_bias",
                                       "top_k",
                                       "min_p",
                                       "repetition_penalty",
                                       "ignore_eos",
                                       "min_tokens",
                                       "stop_token_ids",
                                       "skip_special_tokens",
                                       "return_tokens_as_token_ids"};

constexpr int kMaxN = 16;

void check_model(const Fields& f, const ServedModel& m, GenerationRequest& r) {
  r.model = f.string("model", m.name);
  if (r.model != m.name)
    throw ApiError(
        404, "The model '" + r.model + "' does not exist; this server serves '" + m.name + "'",
        "model");
}

// Bounds of the request fields beyond SamplingParams' own (named so a client can be told them).
constexpr int64_t kMaxStopTokenIds = 64;  // stop_token_ids entries (vLLM has no limit; 64 is ample)
constexpr int64_t kMaxTokenCount = int64_t(1) << 30;  // min_tokens: far past any context

// The sampling fields shared by both endpoints. Each is checked here against its range, with the
// value the client sent in the message (nothing is clamped); SamplingParams::validate checks the
// combined ones (min_tokens ≤ max_tokens) after fit_length.
SamplingParams sampling(const Fields& f, const ServedModel& m) {
  const int vocab = m.bundle->model->config().vocab_size;
  SamplingParams p;
  p.temperature = f.number_in("temperature", 1.0, 0.0, 2.0);
  p.top_p = f.number_in("top_p", 1.0, 0.0, 1.0, /*lo_open=*/true);
  p.presence_penalty = f.number_in("presence_penalty", 0.0, -2.0, 2.0);
  p.frequency_penalty = f.number_in("frequency_penalty", 0.0, -2.0, 2.0);
  p.min_p = f.number_in("min_p", 0.0, 0.0, 1.0);
  p.repetition_penalty = f.number_in("repetition_penalty", 1.0, 0.0, 2.0, /*lo_open=*/true);
  const int64_t top_k = f.integer("top_k", 0);
  if (top_k < -1 || top_k > vocab)
    f.bad("top_k", "must be -1 or 0 (off) or in [1, " + std::to_string(vocab) +
                       "] (the vocabulary size), got " + std::to_string(top_k));
  p.top_k = top_k == -1 ? 0 : int(top_k);  // vLLM: −1 disables
  p.ignore_eos = f.boolean("ignore_eos", false);
  p.min_tokens = int(f.integer_in("min_tokens", 0, 0, kMaxTokenCount));
  if (f.has("seed")) p.seed = uint64_t(f.integer("seed", 0));  // any int64, as vLLM
  if (f.has("stop")) {
    const json& s = f.at("stop");
    if (s.is_string()) {
      p.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > SamplingParams::kMaxStopStrings)
        f.bad("stop", "may hold at most " + std::to_string(SamplingParams::kMaxStopStrings) +
                          " strings, got " + std::to_string(s.size()));
      for (const json& x : s) {
        if (!x.is_string()) f.bad("stop", "must be a string or a list of strings");
        p.stop.push_back(x.get<std::string>());
      }
    } else {
      f.bad("stop", "must be a string or a list of strings");
    }
    for (size_t i = 0; i < p.stop.size(); ++i)
      if (p.stop[i].empty())
        f.bad("stop", "holds an empty string (at index " + std::to_string(i) + ")");
  }
  if (f.has("stop_token_ids")) {
    const json& s = f.at("stop_token_ids");
    if (!s.is_array()) f.bad("stop_token_ids", "must be a list of token ids");
    if (int64_t(s.size()) > kMaxStopTokenIds)
      f.bad("stop_token_ids", "may hold at most " + std::to_string(kMaxStopTokenIds) +
                                  " ids, got " + std::to_string(s.size()));
    for (size_t i = 0; i < s.size(); ++i) {
      const json& x = s[i];
      if (!x.is_number_integer()) f.bad("stop_token_ids", "must be a list of token ids");
      const bool in_vocab = x.is_number_unsigned()
                                ? x.get<uint64_t>() < uint64_t(vocab)
                                : x.get<int64_t>() >= 0 && x.get<int64_t>() < vocab;
      if (!in_vocab)
        f.bad("stop_token_ids", "holds " + x.dump() + " (at index " + std::to_string(i) +
                                    "), outside the vocabulary [0, " + std::to_string(vocab) + ")");
      p.stop_token_ids.push_back(int32_t(x.get<int64_t>()));
    }
  }
  if (f.has("logit_bias")) {
    const json& b = f.at("logit_bias");
    if (!b.is_object()) f.bad("logit_bias", "must be an object");
    if (!b.empty()) f.bad("logit_bias", "is not supported by this server");
  }
  if (f.has("user")) (void)f.string("user", "");
  if (f.has("skip_special_tokens") && !f.boolean("skip_special_tokens", true))
    f.bad("skip_special_tokens", "false is not supported (special tokens are always skipped)");
  return p;
}

void stream_fields(const Fields& f, GenerationRequest& r) {
  r.return_tokens_as_token_ids = f.boolean("return_tokens_as_token_ids", false);
  r.stream = f.boolean("stream", false);
  if (f.has("stream_options")) {
    const json& so = f.at("stream_options");
    if (!so.is_object()) f.bad("stream_options", "must be an object");
    if (!r.stream) f.bad("stream_options", "is only allowed when 'stream' is true");
    for (auto it = so.begin(); it != so.end(); ++it) {
      if (it.key() == "include_usage") {
        if (!it.value().is_boolean()) f.bad("stream_options", "include_usage must be a boolean");
        r.include_usage = it.value().get<bool>();
      } else if (it.key() != "continuous_usage_stats") {
        f.bad("stream_options", "has an unknown key '" + it.key() + "'");
      }
    }
  }
}

int n_choices(const Fields& f) {
  const int64_t n = f.integer("n", 1);
  if (n < 1 || n > kMaxN)
    f.bad("n", "must be between 1 and " + std::to_string(kMaxN) + ", got " + std::to_string(n));
  if (f.has("best_of") && f.integer("best_of", n) != n)
    f.bad("best_of", "must equal n (no beam search)");
  return int(n);
}

// max_tokens against the context: a prompt + max_tokens beyond max_model_len is refused with the
// lengths; no max_tokens means "up to the end of the context" (chat) or 16 (completions).
void fit_length(Choice& c, const Fields& f, const char* key, int64_t dflt, const ServedModel& m,
                bool chat) {
  const int64_t plen = int64_t(c.prompt.size());
  if (plen >= m.max_model_len)
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(m.max_model_len) +
                       " tokens. However, your " +
                       (chat ? "messages resulted in " : "prompt has ") + std::to_string(plen) +
                       " tokens. Please reduce the length of the " +
                       (chat ? "messages." : "prompt."),
                   chat ? "messages" : "prompt");
  int64_t max_tokens = dflt > 0 ? dflt : m.max_model_len - plen;
  if (f.has(key)) {
    max_tokens = f.integer(key, 0);
    if (max_tokens < 1) f.bad(key, "must be at least 1, got " + std::to_string(max_tokens));
    if (max_tokens > m.max_model_len - plen)  // (plen + max_tokens could overflow)
      throw ApiError(400,
                     "This model's maximum context length is " + std::to_string(m.max_model_len) +
                         " tokens. However, you requested " +
                         (max_tokens > INT32_MAX ? "more than " + std::to_string(INT32_MAX)
                                                 : std::to_string(plen + max_tokens)) +
                         " tokens (" + std::to_string(plen) + " in the " +
                         (chat ? "messages" : "prompt") + ", " + std::to_string(max_tokens) +
                         " in the completion). Please reduce the length.",
                     key);
  } else {
    max_tokens = std::min(max_tokens, m.max_model_len - plen);
  }
  c.params.max_tokens = int(max_tokens);
}

void expand_n(GenerationRequest& r, const std::vector<Choice>& prompts, int n) {
  for (const Choice& base : prompts)
    for (int j = 0; j < n; ++j) {
      Choice c = base;
      if (c.params.seed) c.params.seed = *c.params.seed + uint64_t(j);  // distinct but reproducible
      r.choices.push_back(std::move(c));
    }
}

void validate_all(GenerationRequest& r, const ServedModel& m) {
  for (const Choice& c : r.choices) {
    try {
      c.params.validate(m.bundle->model->config().vocab_size);
    } catch (const Error& e) {
      throw ApiError(400, e.what());
    }
  }
}

std::vector<int32_t> ids_of(const json& a, const ServedModel& m, const char* field) {
  std::vector<int32_t> ids;
  const int vocab = m.bundle->model->config().vocab_size;
  for (const json& x : a) {
    if (!x.is_number_integer())
      throw ApiError(400, std::string("'") + field + "' token ids must be integers", field);
    const int64_t v = x.get<int64_t>();
    if (v < 0 || v >= vocab)
      throw ApiError(400,
                     std::string("'") + field + "' has token id " + std::to_string(v) +
                         " outside the vocabulary [0, " + std::to_string(vocab) + ")",
                     field);
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) throw ApiError(400, std::string("'") + field + "' is empty", field);
  return ids;
}

std::vector<int32_t> encode(const ServedModel& m, const std::string& text, const char* field) {
  if (!m.bundle->tokenizer)
    throw ApiError(
        400, "this model has no tokenizer; send '" + std::string(field) + "' as token ids", field);
  try {
    return m.bundle->encode_text(text);
  } catch (const Error& e) {
    throw ApiError(400, std::string("'") + field + "': " + e.what(), field);
  }
}

}  // namespace

GenerationRequest parse_completion_request(const json& body, const ServedModel& m) {
  std::set<std::string> allowed = kCommon;
  allowed.insert({"prompt", "logprobs", "echo", "best_of", "suffix"});
  Fields f(body, allowed);
  GenerationRequest r;
  check_model(f, m, r);
  stream_fields(f, r);
  if (f.has("suffix")) f.bad("suffix", "is not supported by this server");
  r.echo = f.boolean("echo", false);
  if (r.echo && r.stream) f.bad("echo", "is not supported with stream");
  if (f.has("logprobs")) {
    const int64_t lp = f.integer("logprobs", 0);
    if (lp < 0 || lp > SamplingParams::kMaxLogprobs)
      f.bad("logprobs", "must be between 0 and " + std::to_string(SamplingParams::kMaxLogprobs) +
                            ", got " + std::to_string(lp));
    r.logprobs = int(lp);
  }
  if (!f.has("prompt")) throw ApiError(400, "'prompt' is required", "prompt");
  const SamplingParams p = sampling(f, m);
  const json& pr = f.at("prompt");
  std::vector<Choice> prompts;
  auto add_text = [&](const std::string& s) {
    if (s.empty()) throw ApiError(400, "'prompt' is empty", "prompt");
    prompts.push_back({encode(m, s, "prompt"), s, p});
  };
  if (pr.is_string()) {
    add_text(pr.get<std::string>());
  } else if (pr.is_array() && !pr.empty() && pr[0].is_number_integer()) {
    prompts.push_back({ids_of(pr, m, "prompt"), "", p});
  } else if (pr.is_array() && !pr.empty()) {
    if (pr.size() > size_t(kMaxN))
      f.bad("prompt", "has more than " + std::to_string(kMaxN) + " prompts");
    for (const json& x : pr) {
      if (x.is_string())
        add_text(x.get<std::string>());
      else if (x.is_array())
        prompts.push_back({ids_of(x, m, "prompt"), "", p});
      else
        f.bad("prompt", "must be a string, a list of strings, or token ids");
    }
  } else {
    f.bad("prompt",
          pr.is_array() ? "is empty" : "must be a string, a list of strings, or token ids");
  }
  for (Choice& c : prompts) {
    c.params.logprobs = r.logprobs;
    fit_length(c, f, "max_tokens", 16, m, false);
    if (r.echo && c.prompt_text.empty() && m.bundle->tokenizer)
      c.prompt_text = m.bundle->tokenizer->decode(
          std::vector<tokenizer::TokenId>(c.prompt.begin(), c.prompt.end()));
  }
  expand_n(r, prompts, n_choices(f));
  if (r.choices.size() > size_t(kMaxN))
    f.bad("n", "times the number of prompts exceeds " + std::to_string(kMaxN));
  validate_all(r, m);
  return r;
}

GenerationRequest parse_chat_request(const json& body, const ServedModel& m,
                                     const std::string* raw_body) {
  std::set<std::string> allowed = kCommon;
  allowed.insert({"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                  "response_format", "tools", "tool_choice", "parallel_tool_calls",
                  "chat_template_kwargs", "best_of"});
  Fields f(body, allowed);
  GenerationRequest r;
  r.chat = true;
  check_model(f, m, r);
  stream_fields(f, r);
  const bool lp = f.boolean("logprobs", false);
  if (f.has("top_logprobs")) {
    const int64_t t = f.integer("top_logprobs", 0);
    if (t < 0 || t > SamplingParams::kMaxLogprobs)
      f.bad("top_logprobs", "must be between 0 and " +
                                std::to_string(SamplingParams::kMaxLogprobs) + ", got " +
                                std::to_string(t));
    if (!lp) f.bad("top_logprobs", "requires 'logprobs' to be true");
    r.logprobs = int(t);
  } else if (lp) {
    r.logprobs = 0;
  }
  if (f.has("response_format")) {
    const json& rf = f.at("response_format");
    if (!rf.is_object() || rf.value("type", "") != "text")
      f.bad("response_format", "only {\"type\": \"text\"} is supported");
  }
  const ChatTools tools = parse_chat_tools(body, raw_body);
  if (tools.choice != ToolChoice::kNone && !m.tool_call_parser)
    f.bad("tools",
          "need a tool-call parser: start the server with --tool-call-parser deepseek_v3, "
          "deepseek_v31 or deepseek_v32 (none was given or found in the chat template)");
  tokenizer::ChatOptions co;
  co.tools = tools.schemas;
  if (f.has("chat_template_kwargs")) {
    const json& k = f.at("chat_template_kwargs");
    if (!k.is_object()) f.bad("chat_template_kwargs", "must be an object");
    for (auto it = k.begin(); it != k.end(); ++it) {
      if ((it.key() == "thinking" || it.key() == "enable_thinking") && it.value().is_boolean())
        co.thinking = it.value().get<bool>();
      else
        f.bad("chat_template_kwargs", "supports only the boolean 'thinking'");
    }
  }
  if (!f.has("messages")) throw ApiError(400, "'messages' is required", "messages");
  const std::vector<tokenizer::ChatMessage> msgs = parse_api_messages(f.at("messages"));
  if (!m.bundle->chat)
    throw ApiError(
        400,
        "this model has no tokenizer, so chat is unavailable; use /v1/completions with token ids",
        "messages");
  Choice c;
  try {
    c.prompt = m.bundle->encode_chat(msgs, co);
  } catch (const Error& e) {
    throw ApiError(400, std::string("'messages': ") + e.what(), "messages");
  }
  // tool_choice required / a named function: the prompt ends inside a call (no reasoning first).
  r.chat_output.thinking = co.thinking;
  r.chat_output.reasoning_parser = m.reasoning_parser;
  if (tools.choice != ToolChoice::kNone) r.chat_output.tool_parser = m.tool_call_parser;
  if (tools.choice == ToolChoice::kRequired || tools.choice == ToolChoice::kNamed) {
    const std::string prefix = ToolCallParser::forced_prefix(
        *m.tool_call_parser, tools.choice == ToolChoice::kNamed ? &tools.named : nullptr);
    r.chat_output.assumed_prefix = prefix;
    r.chat_output.reasoning_parser.reset();
    const bool opened_thinking =
        co.thinking && m.bundle->chat->format() != tokenizer::ChatFormat::kDeepSeekV3;
    tokenizer::EncodeOptions eo;
    eo.add_special_tokens = false;
    for (auto id : m.bundle->tokenizer->encode((opened_thinking ? "</think>" : "") + prefix, eo))
      c.prompt.push_back(id);
  }
  c.params = sampling(f, m);
  c.params.logprobs = r.logprobs;
  c.params.skip_special_tokens = !(r.chat_output.tool_parser || r.chat_output.reasoning_parser);
  const char* key = f.has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  fit_length(c, f, key, 0, m, true);
  expand_n(r, {c}, n_choices(f));
  validate_all(r, m);
  return r;
}

}  // namespace osprey::server
