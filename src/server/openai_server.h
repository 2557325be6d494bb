// The OpenAI-compatible routes over an AsyncEngine:
//   POST /v1/completions, POST /v1/chat/completions (stream or not; SSE ending with [DONE];
//   usage, stream_options.include_usage), GET /v1/models, GET /health, GET /metrics,
//   POST /tokenize, POST /detokenize.
// Errors are OpenAI error objects with their status: 400 invalid JSON or parameters (and a prompt
// longer than max_model_len, with the lengths), 401 a missing or wrong API key, 404 an unknown
// model or route, 405 a wrong method, 413 a body over the limit (refused before parsing, in the
// HTTP layer), 503 when the queue is full or the server is shutting down. A client that
// disconnects aborts its requests.
//
// Shutdown (SIGTERM / SIGINT in `osprey serve`): begin_shutdown() makes new generation requests
// 503; wait_idle() waits for those in flight; abort_in_flight() ends the rest, a stream with a
// final error event and [DONE], a plain request with a 503.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "engine/async_engine.h"
#include "engine/model_bundle.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/openai.h"

namespace osprey::server {

struct ServerOptions {
  std::string served_model_name;
  std::string api_key;       // empty: no key needed
  size_t max_queued = 4096;  // requests admitted beyond the running batch before 503
  int max_num_seqs = 64;
  std::optional<ToolCallFormat> tool_call_parser;   // --tool-call-parser
  std::optional<ReasoningFormat> reasoning_parser;  // --reasoning-parser
};

class OpenAIServer {
 public:
  OpenAIServer(const ModelBundle& bundle, AsyncEngine& engine, Metrics& metrics,
               ServerOptions opts);
  void handle(const HttpRequest& req, std::shared_ptr<Responder> res);

  void begin_shutdown();
  // Generation requests still in flight; waits until there are none or the deadline passes.
  size_t wait_idle(std::chrono::steady_clock::time_point deadline);
  size_t in_flight() const;
  void abort_in_flight();

  struct InFlight;  // the live generation requests (openai_server.cpp)

 private:
  void generate(const HttpRequest& req, std::shared_ptr<Responder> res, bool chat);
  void models(std::shared_ptr<Responder> res);
  void tokenize(const HttpRequest& req, std::shared_ptr<Responder> res);
  void detokenize(const HttpRequest& req, std::shared_ptr<Responder> res);
  void error(std::shared_ptr<Responder> res, const ApiError& e);

  const ModelBundle& bundle_;
  AsyncEngine& engine_;
  Metrics& metrics_;
  ServerOptions opts_;
  ServedModel served_;
  std::shared_ptr<InFlight> in_flight_;
  std::atomic<bool> shutting_down_{false};
};

}  // namespace osprey::server
