#include "mock_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>

namespace osprey::bench::testing {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using nlohmann::json;

void sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// One SSE event as one HTTP chunk.
void send_event(tcp::socket& s, const std::string& data) {
  const std::string event = "data: " + data + "\n\n";
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", event.size());
  boost::system::error_code ec;
  asio::write(s, asio::buffer(std::string(size) + event + "\r\n"), ec);
}

void send_plain(tcp::socket& s, int status, const char* reason, const std::string& content_type,
                const std::string& body) {
  const std::string msg =
      "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + content_type +
      "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  boost::system::error_code ec;
  asio::write(s, asio::buffer(msg), ec);
}

}  // namespace

MockServer::MockServer(MockScript script)
    : script_(std::move(script)),
      step_sum_(script_.step_sum_start),
      step_count_(script_.step_count_start) {
  const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
  acceptor_socket_.open(ep.protocol());
  acceptor_socket_.set_option(tcp::acceptor::reuse_address(true));
  acceptor_socket_.bind(ep);
  acceptor_socket_.listen(512);
  port_ = acceptor_socket_.local_endpoint().port();
  acceptor_ = std::thread([this] { accept_loop(); });
}

MockServer::~MockServer() {
  stop_ = true;
  {  // wake the blocking accept
    asio::io_context ioc;
    tcp::socket s(ioc);
    boost::system::error_code ec;
    s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port_)), ec);
  }
  acceptor_.join();
  for (auto& t : workers_) t.join();
}

std::vector<SeenRequest> MockServer::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_;
}

void MockServer::accept_loop() {
  while (!stop_) {
    tcp::socket s(ioc_);
    boost::system::error_code ec;
    acceptor_socket_.accept(s, ec);
    if (ec || stop_) break;
    workers_.emplace_back([this, sock = std::move(s)]() mutable { serve(std::move(sock)); });
  }
}

void MockServer::serve(tcp::socket s) {
  boost::beast::flat_buffer buffer;
  http::request<http::string_body> req;
  boost::system::error_code ec;
  http::read(s, buffer, req, ec);
  if (ec) return;
  const std::string target(req.target());
  if (req.method() == http::verb::get && target == "/v1/models") {
    send_plain(s, 200, "OK", "application/json",
               R"({"object":"list","data":[{"id":"mock-model","object":"model"},{"id":"other"}]})");
    return;
  }
  if (req.method() == http::verb::get && target == "/metrics") {
    std::string text;
    {
      std::lock_guard<std::mutex> lock(mu_);
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "# HELP osprey_step_duration_seconds Engine step time.\n"
                    "# TYPE osprey_step_duration_seconds histogram\n"
                    "osprey_step_duration_seconds_bucket{le=\"0.05\"} %.0f\n"
                    "osprey_step_duration_seconds_sum %.9f\n"
                    "osprey_step_duration_seconds_count %.0f\n"
                    "osprey_requests_total 7\n",
                    step_count_, step_sum_, step_count_);
      text = buf;
    }
    send_plain(s, 200, "OK", "text/plain; version=0.0.4", text);
    return;
  }
  const bool chat = target == "/v1/chat/completions";
  if (req.method() != http::verb::post || (!chat && target != "/v1/completions")) {
    send_plain(s, 404, "Not Found", "application/json", R"({"error":{"message":"no route"}})");
    return;
  }
  const int ordinal = next_ordinal_++;
  json body = json::parse(req.body(), nullptr, false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back({target, std::string(req[http::field::authorization]), body});
  }
  if (script_.fail_500.count(ordinal)) {
    send_plain(s, 500, "Internal Server Error", "application/json",
               R"({"error":{"message":"mock failure","type":"server_error"}})");
    return;
  }
  const int max_tokens = body.value("max_tokens", 16);
  const int chunks = (max_tokens + script_.tokens_per_chunk - 1) / script_.tokens_per_chunk;
  const std::string head =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
      "Connection: close\r\n\r\n";
  asio::write(s, asio::buffer(head), ec);
  if (chat)  // a role-only chunk at once: not a token, must not count for TTFT
    send_event(
        s,
        R"({"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})");
  sleep_ms(script_.ttft_ms);
  for (int c = 0; c < chunks; ++c) {
    if (c > 0) sleep_ms(script_.itl_ms);
    std::string text;
    for (int t = 0; t < script_.tokens_per_chunk; ++t) text += "w" + std::to_string(c) + " ";
    json ev = chat
                  ? json{{"object", "chat.completion.chunk"},
                         {"choices", {{{"index", 0}, {"delta", {{"content", text}}}}}}}
                  : json{{"object", "text_completion"},
                         {"choices", {{{"index", 0}, {"text", text}, {"finish_reason", nullptr}}}}};
    send_event(s, ev.dump());
    ++chunks_sent_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      step_sum_ += script_.step_s;
      step_count_ += 1;
    }
    if (c == 1 && script_.drop_after_2.count(ordinal)) {
      s.shutdown(tcp::socket::shutdown_both, ec);
      s.close(ec);
      return;
    }
  }
  if (script_.send_usage)
    send_event(s, json{{"choices", json::array()},
                       {"usage", {{"prompt_tokens", 1234}, {"completion_tokens", max_tokens}}}}
                      .dump());
  send_event(s, "[DONE]");
  asio::write(s, asio::buffer(std::string("0\r\n\r\n")), ec);
  s.shutdown(tcp::socket::shutdown_send, ec);
  // Let the client read to the end before the socket goes.
  char sink[64];
  s.read_some(asio::buffer(sink), ec);
}

}  // namespace osprey::bench::testing
