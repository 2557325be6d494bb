// The OpenAI protocol: request bodies of /v1/completions and /v1/chat/completions checked field by
// field and turned into engine requests, and the error objects sent back.
//
// Every field has a type and a range; an unknown field is refused (as OpenAI does), with the
// field's name in the message. OpenAI fields map to SamplingParams as vLLM maps them, with vLLM's
// extras (top_k, min_p, repetition_penalty, ignore_eos, min_tokens, stop_token_ids).
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/model_bundle.h"
#include "engine/sampling_params.h"
#include "server/chat_output.h"

namespace osprey::server {

// An error with its HTTP status, sent as {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "")
      : std::runtime_error(message), status(status), param(std::move(param)) {}
  int status;
  std::string param;
  std::string type() const;  // invalid_request_error, authentication_error, ...
  std::string json() const;
};

struct ServedModel {
  std::string name;  // the served model name
  const ModelBundle* bundle = nullptr;
  int max_model_len = 0;
  std::optional<ToolCallFormat> tool_call_parser;   // --tool-call-parser (or from the template)
  std::optional<ReasoningFormat> reasoning_parser;  // --reasoning-parser (or from the template)
};

struct Choice {
  std::vector<int32_t> prompt;
  std::string prompt_text;  // for echo
  SamplingParams params;
};

struct GenerationRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  int logprobs = -1;  // top alternatives per token; −1: none
  // vLLM's extension: logprobs name tokens "token_id:<id>" instead of their text (for models
  // without a tokenizer, and for comparing token sequences exactly).
  bool return_tokens_as_token_ids = false;
  std::string model;
  std::vector<Choice> choices;    // the choice index is the position here
  ChatOutputOptions chat_output;  // chat: the parsers that read each choice's text
};

GenerationRequest parse_completion_request(const nlohmann::json& body, const ServedModel& m);
// `raw_body` (the request text) keeps the client's key order in tool schemas (chat_tools.h).
GenerationRequest parse_chat_request(const nlohmann::json& body, const ServedModel& m,
                                     const std::string* raw_body = nullptr);
// The body as JSON, or ApiError 400 naming what is wrong (invalid JSON, invalid UTF-8, not an
// object).
nlohmann::json parse_body(const std::string& body);

}  // namespace osprey::server
