// libFuzzer target for the OpenAI request parser and validator: the input is a request body, given
// to both /v1/chat/completions' and /v1/completions' parsers against the bundled model
// (OSPREY_FUZZ_MODEL, default models/osprey-arith) with max_model_len kMaxModelLen. Any body must
// be refused with ApiError (a 4xx the server sends back; any other exception would be a 500) or
// give choices the engine accepts as they are: 1..16 of them, non-empty prompts of known ids,
// prompt + max_tokens within max_model_len, sampling values that pass validation, and logprobs in
// range.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/error.h"
#include "engine/model_bundle.h"
#include "server/openai.h"

namespace srv = osprey::server;

namespace {

// Small, so that prompts and max_tokens reach the context limit often.
constexpr int kMaxModelLen = 128;

osprey::ModelBundle* g_bundle = nullptr;
srv::ServedModel g_model;

[[noreturn]] void die(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "openai_request_fuzz: %s %s\n", what, detail.c_str());
  std::abort();
}

void check(const srv::GenerationRequest& r, bool chat) {
  if (r.chat != chat) die("chat flag wrong");
  if (r.choices.empty() || r.choices.size() > 16) die("choice count outside [1, 16]");
  if (r.model != g_model.name) die("model name not the served one");
  if (r.logprobs < -1 || r.logprobs > osprey::SamplingParams::kMaxLogprobs)
    die("logprobs out of range");
  if (r.include_usage && !r.stream) die("include_usage without stream");
  const int vocab = g_bundle->model->config().vocab_size;
  for (const srv::Choice& c : r.choices) {
    if (c.prompt.empty()) die("empty prompt accepted");
    for (int32_t t : c.prompt)
      if (t < 0 || t >= vocab) die("prompt id outside the vocabulary");
    if (c.params.max_tokens < 1 || int64_t(c.prompt.size()) + c.params.max_tokens > kMaxModelLen)
      die("prompt + max_tokens beyond max_model_len");
    if (c.params.logprobs != r.logprobs) die("choice logprobs differ from the request's");
    try {
      c.params.validate(vocab);
    } catch (const osprey::Error& e) {
      die("accepted params fail validation:", e.what());
    }
  }
}

void run(const nlohmann::json& body, bool chat) {
  srv::GenerationRequest r;
  try {
    r = chat ? srv::parse_chat_request(body, g_model)
             : srv::parse_completion_request(body, g_model);
  } catch (const srv::ApiError& e) {
    if (e.status < 400 || e.status > 499) die("non-4xx status", std::to_string(e.status));
    if (std::string(e.what()).empty()) die("empty error message");
    (void)e.json();
    return;
  } catch (const std::exception& e) {
    die("an exception other than ApiError escaped (the server would answer 500):", e.what());
  }
  check(r, chat);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("OSPREY_FUZZ_MODEL");
  try {
    g_bundle =
        new osprey::ModelBundle(osprey::load_model_bundle(dir ? dir : OSPREY_DEFAULT_MODEL_DIR));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "openai_request_fuzz: %s\n", e.what());
    std::exit(2);
  }
  g_model.name = "osprey-arith";
  g_model.bundle = g_bundle;
  g_model.max_model_len = kMaxModelLen;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json body;
  try {
    body = srv::parse_body(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const srv::ApiError& e) {
    if (e.status != 400) die("parse_body status not 400");
    return 0;
  } catch (const std::exception& e) {
    die("parse_body let an exception other than ApiError escape:", e.what());
  }
  run(body, true);
  run(body, false);
  return 0;
}
