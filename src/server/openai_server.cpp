#include "server/openai_server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>

#include "core/error.h"
#include "server/auth.h"

namespace osprey::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  char b[48];
  std::snprintf(b, sizeof b, "%s-%016llx", prefix,
                (unsigned long long)(salt * 0x9e3779b97f4a7c15ull + ++counter));
  return b;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Abort:
      return "abort";
    default:
      return nullptr;
  }
}

}  // namespace

class Job;

// The generation requests in flight, for shutdown: each Job registers once started and leaves when
// it has answered.
struct OpenAIServer::InFlight {
  std::mutex mu;
  std::condition_variable cv;
  std::map<const Job*, std::weak_ptr<Job>> jobs;
  void add(const std::shared_ptr<Job>& j) {
    std::lock_guard<std::mutex> lock(mu);
    jobs[j.get()] = j;
  }
  void remove(const Job* j) {
    std::lock_guard<std::mutex> lock(mu);
    jobs.erase(j);
    cv.notify_all();
  }
};

// One HTTP generation request: its engine requests (one per choice) and what they produced.
class Job : public std::enable_shared_from_this<Job> {
 public:
  Job(GenerationRequest req, std::shared_ptr<Responder> res, AsyncEngine& engine, Metrics& metrics,
      const ModelBundle& bundle, std::shared_ptr<OpenAIServer::InFlight> in_flight)
      : in_flight_(std::move(in_flight)),
        req_(std::move(req)),
        res_(std::move(res)),
        engine_(engine),
        metrics_(metrics),
        bundle_(bundle),
        id_(random_id(req_.chat ? "chatcmpl" : "cmpl")),
        created_(unix_now()),
        start_(Clock::now()) {}

  // Submits every choice; throws ApiError (nothing stays queued) if the engine refuses one.
  void start() {
    for (Choice& c : req_.choices) {
      try {
        streams_.push_back(engine_.submit(c.prompt, c.params));
      } catch (const Error& e) {
        for (auto& s : streams_) engine_.abort(s->id());
        throw ApiError(400, e.what());
      }
      state_.emplace_back();
      state_.back().prompt_tokens = int(c.prompt.size());
      if (req_.chat)
        state_.back().chat =
            std::make_unique<ChatOutput>(req_.chat_output, [] { return random_id("call"); });
    }
    if (req_.stream) res_->start_stream(200, "text/event-stream");
    auto self = shared_from_this();
    in_flight_->add(self);
    res_->on_close([self] { self->abort_all(); });
    for (auto& s : streams_) {
      std::weak_ptr<Job> weak = self;
      s->set_notify([weak] {
        if (auto j = weak.lock()) j->schedule_drain();
      });
    }
    schedule_drain();  // outputs may have arrived before the notifiers were set
  }

  // Shutdown after the drain timeout (on the connection's strand): the engine requests are aborted
  // and the client told why: a stream gets an error event and [DONE], a plain request a 503.
  void shutdown_abort() {
    if (done_) return;
    aborted_ = true;
    for (auto& s : streams_) engine_.abort(s->id());
    const ApiError e(503,
                     "the server is shutting down: the request was aborted at the end of the "
                     "drain timeout (--shutdown-timeout)");
    if (req_.stream) {
      res_->write("data: " + e.json() + "\n\n");
      res_->write("data: [DONE]\n\n");
      res_->end();
    } else {
      res_->respond(503, "application/json", e.json());
    }
    res_->annotate("aborted_by_shutdown");
    metrics_.request_failed();
    finish();
  }
  std::shared_ptr<Responder> responder() const { return res_; }

 private:
  struct State {
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<TokenLogprob> logprobs;
    FinishReason finish = FinishReason::None;
    int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    bool sent_role = false;
    Clock::time_point last;
    std::unique_ptr<ChatOutput> chat;  // chat: reasoning, content and tool calls of the text
  };

  // A chat choice that called tools and stopped finishes with "tool_calls".
  const char* chat_finish(const State& s, FinishReason r) const {
    const char* name = finish_name(r);
    if (s.chat && s.chat->has_tool_calls() && r == FinishReason::Stop) return "tool_calls";
    return name;
  }

  void schedule_drain() {
    if (drain_pending_.exchange(true)) return;
    auto self = shared_from_this();
    res_->post([self] {
      self->drain_pending_ = false;
      self->drain();
    });
  }

  void abort_all() {
    if (done_) return;
    aborted_ = true;
    for (auto& s : streams_) engine_.abort(s->id());
    metrics_.request_failed();
  }

  json token_logprobs_completion(const std::vector<TokenLogprob>& lps, size_t text_offset) const {
    json tokens = json::array(), token_lps = json::array(), tops = json::array(),
         offsets = json::array();
    for (const TokenLogprob& t : lps) {
      tokens.push_back(token_text(t.token));
      token_lps.push_back(t.logprob);
      json top = json::object();
      for (const auto& [id, lp] : t.top) top[token_text(id)] = lp;
      tops.push_back(top);
      offsets.push_back(text_offset);
      text_offset += token_text(t.token).size();
    }
    return {{"tokens", tokens},
            {"token_logprobs", token_lps},
            {"top_logprobs", tops},
            {"text_offset", offsets}};
  }

  json token_logprobs_chat(const std::vector<TokenLogprob>& lps) const {
    json content = json::array();
    auto entry = [&](int32_t id, float lp) {
      const std::string s = token_text(id);
      json bytes = json::array();
      for (unsigned char ch : s) bytes.push_back(int(ch));
      return json{{"token", s}, {"logprob", lp}, {"bytes", bytes}};
    };
    for (const TokenLogprob& t : lps) {
      json e = entry(t.token, t.logprob);
      json top = json::array();
      for (const auto& [id, lp] : t.top) top.push_back(entry(id, lp));
      e["top_logprobs"] = top;
      content.push_back(e);
    }
    return {{"content", content}};
  }

  std::string token_text(int32_t id) const {
    if (req_.return_tokens_as_token_ids) return "token_id:" + std::to_string(id);
    if (bundle_.tokenizer && bundle_.tokenizer->is_known(id))
      return std::string(bundle_.tokenizer->token_bytes(id));
    return "";
  }

  json usage() const {
    int prompt = 0, completion = 0, cached = 0;
    for (const State& s : state_) {
      completion += s.completion_tokens;
      cached += s.cached_tokens;
    }
    // Prompt tokens count once per distinct prompt (n choices share one prompt).
    const size_t n = state_.size();
    for (size_t i = 0; i < n; ++i)
      if (i == 0 || req_.choices[i].prompt != req_.choices[i - 1].prompt)
        prompt += state_[i].prompt_tokens;
    json u = {{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion}};
    if (cached) u["prompt_tokens_details"] = {{"cached_tokens", cached}};
    return u;
  }

  void send_event(const json& j) { res_->write("data: " + dump(j) + "\n\n"); }

  void stream_delta(size_t i, const RequestOutput& o, const ChatDelta& d) {
    State& s = state_[i];
    const char* fin = o.finished ? finish_name(o.finish_reason) : nullptr;
    json choice;
    if (req_.chat) {
      if (!s.sent_role) {
        s.sent_role = true;
        send_event({{"id", id_},
                    {"object", "chat.completion.chunk"},
                    {"created", created_},
                    {"model", req_.model},
                    {"choices",
                     {{{"index", i},
                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                       {"logprobs", nullptr},
                       {"finish_reason", nullptr}}}}});
      }
      std::vector<json> deltas = s.chat->delta_json(d);
      if (deltas.empty() && !fin && o.logprobs.empty()) return;
      if (deltas.empty()) deltas.push_back(json::object());
      if (fin) fin = chat_finish(s, o.finish_reason);
      for (size_t k = 0; k < deltas.size(); ++k) {
        const bool last = k + 1 == deltas.size();
        choice = {{"index", i},
                  {"delta", deltas[k]},
                  {"logprobs", k == 0 && req_.logprobs >= 0 && !o.logprobs.empty()
                                   ? token_logprobs_chat(o.logprobs)
                                   : json(nullptr)},
                  {"finish_reason", fin && last ? json(fin) : json(nullptr)}};
        send_event({{"id", id_},
                    {"object", "chat.completion.chunk"},
                    {"created", created_},
                    {"model", req_.model},
                    {"choices", {choice}}});
      }
    } else {
      if (o.text.empty() && !fin && o.logprobs.empty()) return;
      choice = {{"index", i},
                {"text", o.text},
                {"logprobs", req_.logprobs >= 0 ? token_logprobs_completion(
                                                      o.logprobs, s.text.size() - o.text.size())
                                                : json(nullptr)},
                {"finish_reason", fin ? json(fin) : json(nullptr)}};
      send_event({{"id", id_},
                  {"object", "text_completion"},
                  {"created", created_},
                  {"model", req_.model},
                  {"choices", {choice}}});
    }
  }

  void drain() {
    if (done_) return;
    size_t finished = 0;
    for (size_t i = 0; i < streams_.size(); ++i) {
      State& s = state_[i];
      RequestOutput o;
      while (s.finish == FinishReason::None && streams_[i]->try_next(&o)) {
        const auto now = Clock::now();
        if (!o.new_tokens.empty()) {
          if (s.tokens.empty())
            metrics_.observe_ttft(std::chrono::duration<double>(now - start_).count());
          else
            metrics_.observe_itl(std::chrono::duration<double>(now - s.last).count());
          s.last = now;
        }
        s.text += o.text;
        s.tokens.insert(s.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
        s.logprobs.insert(s.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
        s.completion_tokens = o.completion_tokens;
        s.cached_tokens = o.cached_tokens;
        if (o.finished) {
          s.finish = o.finish_reason;
          metrics_.observe_e2e(std::chrono::duration<double>(now - start_).count());
          if (!aborted_) metrics_.request_finished(finish_name(o.finish_reason));
        }
        ChatDelta d;
        if (s.chat) {
          d = s.chat->feed(o.text);
          if (o.finished) {
            ChatDelta rest = s.chat->finish();
            d.reasoning += rest.reasoning;
            d.content += rest.content;
            for (auto& c : rest.calls) d.calls.push_back(std::move(c));
          }
        }
        if (req_.stream && !aborted_) stream_delta(i, o, d);
      }
      if (s.finish != FinishReason::None) ++finished;
    }
    if (finished < streams_.size() || aborted_) {
      if (finished == streams_.size()) finish();
      return;
    }
    finish();
    annotate_usage();
    if (req_.stream) {
      if (req_.include_usage)
        send_event({{"id", id_},
                    {"object", req_.chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", created_},
                    {"model", req_.model},
                    {"choices", json::array()},
                    {"usage", usage()}});
      res_->write("data: [DONE]\n\n");
      res_->end();
      return;
    }
    json choices = json::array();
    for (size_t i = 0; i < state_.size(); ++i) {
      const State& s = state_[i];
      if (req_.chat) {
        choices.push_back(
            {{"index", i},
             {"message", s.chat->message_json()},
             {"logprobs", req_.logprobs >= 0 ? token_logprobs_chat(s.logprobs) : json(nullptr)},
             {"finish_reason", chat_finish(s, s.finish)}});
      } else {
        const std::string prefix = req_.echo ? req_.choices[i].prompt_text : "";
        choices.push_back(
            {{"index", i},
             {"text", prefix + s.text},
             {"logprobs", req_.logprobs >= 0 ? token_logprobs_completion(s.logprobs, prefix.size())
                                             : json(nullptr)},
             {"finish_reason", finish_name(s.finish)}});
      }
    }
    res_->respond(200, "application/json",
                  dump({{"id", id_},
                        {"object", req_.chat ? "chat.completion" : "text_completion"},
                        {"created", created_},
                        {"model", req_.model},
                        {"choices", choices},
                        {"usage", usage()}}));
  }

  void finish() {
    done_ = true;
    in_flight_->remove(this);
  }

  void annotate_usage() {
    std::string finish;
    for (const State& st : state_) {
      if (!finish.empty()) finish += ',';
      finish += finish_name(st.finish) ? finish_name(st.finish) : "none";
    }
    const json u = usage();
    res_->annotate("id=" + id_ + " prompt_tokens=" + std::to_string(u["prompt_tokens"].get<int>()) +
                   " completion_tokens=" + std::to_string(u["completion_tokens"].get<int>()) +
                   " finish=" + finish);
  }

  std::shared_ptr<OpenAIServer::InFlight> in_flight_;
  GenerationRequest req_;
  std::shared_ptr<Responder> res_;
  AsyncEngine& engine_;
  Metrics& metrics_;
  const ModelBundle& bundle_;
  std::string id_;
  int64_t created_;
  Clock::time_point start_;
  std::vector<std::shared_ptr<RequestStream>> streams_;
  std::vector<State> state_;
  std::atomic<bool> drain_pending_{false};
  bool done_ = false, aborted_ = false;
};

OpenAIServer::OpenAIServer(const ModelBundle& bundle, AsyncEngine& engine, Metrics& metrics,
                           ServerOptions opts)
    : bundle_(bundle),
      engine_(engine),
      metrics_(metrics),
      opts_(std::move(opts)),
      in_flight_(std::make_shared<InFlight>()) {
  served_.name = opts_.served_model_name;
  served_.bundle = &bundle_;
  served_.max_model_len = engine_.max_model_len();
  served_.tool_call_parser = opts_.tool_call_parser;
  served_.reasoning_parser = opts_.reasoning_parser;
}

void OpenAIServer::begin_shutdown() {
  shutting_down_ = true;
}

size_t OpenAIServer::in_flight() const {
  std::lock_guard<std::mutex> lock(in_flight_->mu);
  return in_flight_->jobs.size();
}

size_t OpenAIServer::wait_idle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(in_flight_->mu);
  in_flight_->cv.wait_until(lock, deadline, [&] { return in_flight_->jobs.empty(); });
  return in_flight_->jobs.size();
}

void OpenAIServer::abort_in_flight() {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard<std::mutex> lock(in_flight_->mu);
    for (const auto& [p, w] : in_flight_->jobs)
      if (auto j = w.lock()) jobs.push_back(j);
  }
  for (auto& j : jobs) j->responder()->post([j] { j->shutdown_abort(); });
}

void OpenAIServer::error(std::shared_ptr<Responder> res, const ApiError& e) {
  metrics_.request_failed();
  res->respond(e.status, "application/json", e.json());
}

void OpenAIServer::handle(const HttpRequest& req, std::shared_ptr<Responder> res) {
  try {
    const bool v1 = req.path.rfind("/v1/", 0) == 0;
    if (v1 && !opts_.api_key.empty() && !bearer_matches(req.authorization, opts_.api_key))
      throw ApiError(401, req.authorization.empty()
                              ? "missing API key: send 'Authorization: Bearer <key>'"
                              : "incorrect API key provided");
    auto need = [&](const char* method) {
      if (req.method != method)
        throw ApiError(405, "use " + std::string(method) + " for " + req.path);
    };
    if (req.path == "/health") {
      need("GET");
      res->respond(200, "text/plain", "");
    } else if (req.path == "/metrics") {
      need("GET");
      res->respond(200, "text/plain; version=0.0.4", metrics_.render(engine_.stats()));
    } else if (req.path == "/v1/models") {
      need("GET");
      models(res);
    } else if (req.path == "/v1/completions") {
      need("POST");
      generate(req, res, false);
    } else if (req.path == "/v1/chat/completions") {
      need("POST");
      generate(req, res, true);
    } else if (req.path == "/tokenize") {
      need("POST");
      tokenize(req, res);
    } else if (req.path == "/detokenize") {
      need("POST");
      detokenize(req, res);
    } else {
      throw ApiError(404, "no route " + req.path);
    }
  } catch (const ApiError& e) {
    error(res, e);
  }
}

void OpenAIServer::models(std::shared_ptr<Responder> res) {
  json m = {{"id", served_.name},    {"object", "model"},
            {"created", unix_now()}, {"owned_by", "osprey"},
            {"root", bundle_.dir},   {"max_model_len", served_.max_model_len}};
  res->respond(200, "application/json", dump({{"object", "list"}, {"data", {m}}}));
}

void OpenAIServer::generate(const HttpRequest& req, std::shared_ptr<Responder> res, bool chat) {
  if (shutting_down_) throw ApiError(503, "the server is shutting down and takes no new requests");
  const json body = parse_body(req.body);
  GenerationRequest g =
      chat ? parse_chat_request(body, served_, &req.body) : parse_completion_request(body, served_);
  if (engine_.num_unfinished() + g.choices.size() > size_t(opts_.max_num_seqs) + opts_.max_queued)
    throw ApiError(503, "the server is at capacity (" + std::to_string(engine_.num_unfinished()) +
                            " requests queued or running); retry later");
  auto job = std::make_shared<Job>(std::move(g), res, engine_, metrics_, bundle_, in_flight_);
  job->start();
}

void OpenAIServer::tokenize(const HttpRequest& req, std::shared_ptr<Responder> res) {
  const json body = parse_body(req.body);
  if (!bundle_.tokenizer) throw ApiError(400, "this model has no tokenizer");
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    json chat_body = {{"messages", body["messages"]}, {"max_tokens", 1}};
    for (const char* k : {"model", "chat_template_kwargs"})
      if (body.contains(k)) chat_body[k] = body[k];
    for (auto it = body.begin(); it != body.end(); ++it)
      if (it.key() != "messages" && it.key() != "model" && it.key() != "chat_template_kwargs" &&
          it.key() != "add_generation_prompt")
        throw ApiError(400, "unrecognized request argument '" + it.key() + "'", it.key());
    ServedModel unlimited = served_;
    unlimited.max_model_len = 1 << 30;  // /tokenize reports lengths; it does not refuse them
    ids = parse_chat_request(chat_body, unlimited).choices[0].prompt;
  } else {
    for (auto it = body.begin(); it != body.end(); ++it)
      if (it.key() != "prompt" && it.key() != "model" && it.key() != "add_special_tokens")
        throw ApiError(400, "unrecognized request argument '" + it.key() + "'", it.key());
    if (!body.contains("prompt") || !body["prompt"].is_string())
      throw ApiError(400, "'prompt' (a string) or 'messages' is required", "prompt");
    if (body.contains("model") && body["model"] != served_.name)
      throw ApiError(404, "The model '" + body["model"].dump() + "' does not exist", "model");
    tokenizer::EncodeOptions eo;
    eo.add_special_tokens = body.value("add_special_tokens", true);
    try {
      for (auto t : bundle_.tokenizer->encode(body["prompt"].get<std::string>(), eo))
        ids.push_back(t);
    } catch (const Error& e) {
      throw ApiError(400, std::string("'prompt': ") + e.what(), "prompt");
    }
  }
  res->respond(
      200, "application/json",
      dump({{"tokens", ids}, {"count", ids.size()}, {"max_model_len", served_.max_model_len}}));
}

void OpenAIServer::detokenize(const HttpRequest& req, std::shared_ptr<Responder> res) {
  const json body = parse_body(req.body);
  if (!bundle_.tokenizer) throw ApiError(400, "this model has no tokenizer");
  for (auto it = body.begin(); it != body.end(); ++it)
    if (it.key() != "tokens" && it.key() != "model")
      throw ApiError(400, "unrecognized request argument '" + it.key() + "'", it.key());
  if (!body.contains("tokens") || !body["tokens"].is_array())
    throw ApiError(400, "'tokens' (a list of ids) is required", "tokens");
  std::vector<tokenizer::TokenId> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer()) throw ApiError(400, "'tokens' must hold integers", "tokens");
    const int64_t v = t.get<int64_t>();
    if (v < 0 || v > INT32_MAX || !bundle_.tokenizer->is_known(int32_t(v)))
      throw ApiError(400, "token id " + std::to_string(v) + " is not in the vocabulary", "tokens");
    ids.push_back(int32_t(v));
  }
  res->respond(200, "application/json", dump({{"prompt", bundle_.tokenizer->decode(ids)}}));
}

}  // namespace osprey::server
