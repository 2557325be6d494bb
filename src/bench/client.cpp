#include "bench/client.h"

#include <array>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <nlohmann/json.hpp>

#include "bench/sse.h"
#include "core/error.h"

namespace osprey::bench {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr size_t kReadChunkBytes = 16 * 1024;  // body bytes taken from the parser per read
constexpr size_t kErrorBodyBytes = 4 * 1024;   // of a failed response's body, kept for the message
constexpr size_t kErrorExcerptChars = 300;     // of it, shown in an error message
constexpr const char* kUserAgent = "osprey-bench";

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

Clock::duration to_duration(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

tcp::resolver::results_type resolve(asio::io_context& ioc, const BaseUrl& base) {
  tcp::resolver resolver(ioc);
  beast::error_code ec;
  auto results = resolver.resolve(base.host, std::to_string(base.port), ec);
  if (ec) fail("cannot resolve host '", base.host, "': ", ec.message());
  return results;
}

template <typename Body>
void set_common_headers(http::request<Body>& req, const HttpTarget& t) {
  req.set(http::field::host, t.base.host + ":" + std::to_string(t.base.port));
  req.set(http::field::user_agent, kUserAgent);
  if (!t.api_key.empty()) req.set(http::field::authorization, "Bearer " + t.api_key);
  req.keep_alive(false);
}

// "HTTP 500 Internal Server Error: <error.message or the body's start>"
std::string http_error_message(int status, std::string_view reason, const std::string& body) {
  std::string detail;
  json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      detail = e["message"].get<std::string>();
    else if (e.is_string())
      detail = e.get<std::string>();
  }
  if (detail.empty()) detail = body.substr(0, kErrorExcerptChars);
  std::string msg = str_cat("HTTP ", status);
  if (!reason.empty()) msg += str_cat(" ", reason);
  if (!detail.empty()) msg += ": " + detail;
  return msg;
}

// The generated text an event's first choice carries (completions: text; chat: delta.content,
// else delta.reasoning_content / delta.reasoning); empty when none.
std::string choice_text(const json& choice) {
  if (auto it = choice.find("text"); it != choice.end() && it->is_string()) return *it;
  if (auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
    for (const char* key : {"content", "reasoning_content", "reasoning"})
      if (auto it = d->find(key); it != d->end() && it->is_string() && !it->empty()) return *it;
  }
  return {};
}

// Reads one SSE event into the request's timings. Returns false when the stream must stop (an
// error event or malformed data).
bool on_event(const std::string& data, Clock::time_point now, Clock::time_point sent,
              Clock::time_point& last_content, RequestResult& r) {
  if (data == "[DONE]") return true;
  json j = json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    r.error = "malformed SSE event data: " + data.substr(0, kErrorExcerptChars);
    return false;
  }
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    std::string msg = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                          ? (*e)["message"].get<std::string>()
                          : e->dump();
    r.error = "error event in the stream: " + msg.substr(0, kErrorExcerptChars);
    return false;
  }
  if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
    const std::string text = choice_text((*c)[0]);
    if (!text.empty()) {
      if (r.content_chunks == 0)
        r.ttft = seconds(now - sent);
      else
        r.itl.push_back(seconds(now - last_content));
      last_content = now;
      ++r.content_chunks;
      r.generated_text += text;
    }
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (auto t = u->find("completion_tokens"); t != u->end() && t->is_number_integer())
      r.usage_completion_tokens = t->get<int>();
    if (auto t = u->find("prompt_tokens"); t != u->end() && t->is_number_integer())
      r.usage_prompt_tokens = t->get<int>();
  }
  return true;
}

struct Run {
  asio::io_context ioc{1};
  tcp::resolver::results_type endpoints;
  const HttpTarget* target = nullptr;
  const std::vector<PlannedRequest>* requests = nullptr;
  const RunOptions* options = nullptr;
  std::vector<RequestResult> results;
  Clock::time_point start;
  int in_flight = 0;
  size_t done = 0;
  asio::steady_timer slot_freed{ioc};  // cancelled when a request ends: wakes the dispatcher
};

asio::awaitable<void> stream_one(Run& run, size_t i) {
  const PlannedRequest& planned = (*run.requests)[i];
  RequestResult& r = run.results[i];
  r.prompt_len = planned.prompt_len;
  r.output_len = planned.output_len;
  const Clock::time_point sent = Clock::now();
  r.start = seconds(sent - run.start);
  const Clock::time_point deadline = sent + to_duration(run.options->request_timeout_s);
  const BaseUrl& base = run.target->base;
  const auto use = [](beast::error_code& ec) {
    return asio::redirect_error(asio::use_awaitable, ec);
  };

  beast::tcp_stream stream(co_await asio::this_coro::executor);
  beast::error_code ec;
  stream.expires_at(deadline);
  co_await stream.async_connect(run.endpoints, use(ec));
  if (ec) {
    r.error = str_cat("cannot connect to ", base.host, ":", base.port, ": ", ec.message());
    co_return;
  }
  http::request<http::string_body> req{http::verb::post, base.prefix + run.options->endpoint, 11};
  set_common_headers(req, *run.target);
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "text/event-stream");
  req.body() = planned.body;
  req.prepare_payload();
  co_await http::async_write(stream, req, use(ec));
  if (ec) {
    r.error = "sending the request failed: " + ec.message();
    co_return;
  }

  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  beast::flat_buffer buffer;
  co_await http::async_read_header(stream, buffer, parser, use(ec));
  if (ec) {
    r.error = "no response header: " + ec.message();
    co_return;
  }
  const int status = parser.get().result_int();
  const std::string reason(parser.get().reason());

  std::array<char, kReadChunkBytes> chunk;
  std::string error_body;
  SseParser sse;
  std::vector<std::string> events;
  Clock::time_point last_content = sent;
  bool stopped = false;
  while (!parser.is_done() && !stopped) {
    parser.get().body().data = chunk.data();
    parser.get().body().size = chunk.size();
    co_await http::async_read_some(stream, buffer, parser, use(ec));
    if (ec == http::error::need_buffer) ec = {};
    const Clock::time_point now = Clock::now();
    const size_t n = chunk.size() - parser.get().body().size;
    if (status != 200) {
      error_body.append(chunk.data(), std::min(n, kErrorBodyBytes - std::min(kErrorBodyBytes,
                                                                             error_body.size())));
    } else if (n > 0) {
      events.clear();
      sse.feed(std::string_view(chunk.data(), n), events);
      for (const std::string& e : events)
        if (!on_event(e, now, sent, last_content, r)) {
          stopped = true;
          break;
        }
    }
    if (ec) break;
  }
  if (status != 200) {
    r.error = http_error_message(status, reason, error_body);
    co_return;
  }
  if (!stopped && !ec) {
    events.clear();
    sse.finish(events);
    for (const std::string& e : events)
      if (!on_event(e, Clock::now(), sent, last_content, r)) break;
  }
  if (!r.error.empty()) co_return;
  if (ec) {
    r.error = str_cat("the connection ended before the response did (after ", r.content_chunks,
                      " content chunks): ", ec.message());
    co_return;
  }
  if (r.content_chunks == 0) {
    r.error = "the stream ended without any generated text (no chunk to time TTFT from)";
    co_return;
  }
  r.latency = seconds(last_content - sent);
  r.output_tokens = r.usage_completion_tokens.value_or(r.content_chunks);
  r.success = true;
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
}

asio::awaitable<void> request_task(Run& run, size_t i) {
  try {
    co_await stream_one(run, i);
  } catch (const std::exception& e) {
    run.results[i].success = false;
    run.results[i].error = std::string("client error: ") + e.what();
  }
  --run.in_flight;
  ++run.done;
  run.slot_freed.cancel();
  if (run.options->on_progress) run.options->on_progress(run.done, run.results.size());
}

asio::awaitable<void> dispatch(Run& run) {
  auto executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor);
  for (size_t i = 0; i < run.results.size(); ++i) {
    const Clock::time_point when = run.start + to_duration(run.options->send_times[i]);
    if (when > Clock::now()) {
      timer.expires_at(when);
      co_await timer.async_wait(asio::use_awaitable);
    }
    while (run.options->max_concurrency > 0 && run.in_flight >= run.options->max_concurrency) {
      beast::error_code ec;  // operation_aborted: a slot was freed
      run.slot_freed.expires_at(Clock::time_point::max());
      co_await run.slot_freed.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    ++run.in_flight;
    asio::co_spawn(executor, request_task(run, i), asio::detached);
  }
}

// A GET on its own event loop, so that the timeout applies.
asio::awaitable<void> get_one(const HttpTarget& t, const std::string& path,
                              tcp::resolver::results_type endpoints, double timeout_s,
                              HttpResponse& out, std::string& error) {
  beast::tcp_stream stream(co_await asio::this_coro::executor);
  beast::error_code ec;
  const auto use = [&ec] { return asio::redirect_error(asio::use_awaitable, ec); };
  stream.expires_after(to_duration(timeout_s));
  co_await stream.async_connect(endpoints, use());
  if (ec) {
    error = str_cat("cannot connect to ", t.base.host, ":", t.base.port, ": ", ec.message());
    co_return;
  }
  http::request<http::empty_body> req{http::verb::get, t.base.prefix + path, 11};
  set_common_headers(req, t);
  co_await http::async_write(stream, req, use());
  if (ec) {
    error = "GET " + path + ": " + ec.message();
    co_return;
  }
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  co_await http::async_read(stream, buffer, parser, use());
  if (ec) {
    error = "GET " + path + ": " + ec.message();
    co_return;
  }
  out.status = parser.get().result_int();
  out.body = std::move(parser.get().body());
}

}  // namespace

HttpResponse http_get(const HttpTarget& target, const std::string& path, double timeout_s) {
  asio::io_context ioc{1};
  auto endpoints = resolve(ioc, target.base);
  HttpResponse out;
  std::string error;
  asio::co_spawn(ioc, get_one(target, path, endpoints, timeout_s, out, error), asio::detached);
  ioc.run();
  if (!error.empty()) fail(error);
  return out;
}

RunOutcome run_requests(const HttpTarget& target, const std::vector<PlannedRequest>& requests,
                        const RunOptions& options) {
  OSPREY_CHECK(options.send_times.size() == requests.size(), "one send time per request");
  Run run;
  run.endpoints = resolve(run.ioc, target.base);
  run.target = &target;
  run.requests = &requests;
  run.options = &options;
  run.results.resize(requests.size());
  run.start = Clock::now();
  asio::co_spawn(run.ioc, dispatch(run), asio::detached);
  run.ioc.run();
  RunOutcome out;
  out.duration_s = seconds(Clock::now() - run.start);
  out.results = std::move(run.results);
  return out;
}

}  // namespace osprey::bench
