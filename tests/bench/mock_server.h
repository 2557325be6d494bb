// A mock OpenAI-compatible streaming server for the benchmark tests: /v1/models, /metrics (with
// an osprey_step_duration_seconds histogram) and streamed /v1/completions and
// /v1/chat/completions, with scripted delays and scripted failures. One thread per connection.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace osprey::bench::testing {

struct MockScript {
  int ttft_ms = 100;         // from the request to the first content chunk
  int itl_ms = 15;           // between content chunks
  int tokens_per_chunk = 1;  // usage.completion_tokens = max_tokens, chunks = ceil(max / this)
  bool send_usage = true;
  std::set<int> fail_500;      // request ordinals (0-based, in arrival order) answered HTTP 500
  std::set<int> drop_after_2;  // ordinals whose connection is closed after 2 content chunks
  // The step histogram: starts at these totals; every content chunk sent adds one step of 25 ms.
  double step_sum_start = 100.0, step_count_start = 1000.0, step_s = 0.025;
};

struct SeenRequest {
  std::string target;
  std::string authorization;
  nlohmann::json body;
};

class MockServer {
 public:
  explicit MockServer(MockScript script);
  ~MockServer();
  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<SeenRequest> requests() const;
  int content_chunks_sent() const { return chunks_sent_; }

 private:
  void accept_loop();
  void serve(boost::asio::ip::tcp::socket socket);
  MockScript script_;
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::acceptor acceptor_socket_{ioc_};
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> next_ordinal_{0}, chunks_sent_{0};
  mutable std::mutex mu_;
  std::vector<SeenRequest> seen_;
  double step_sum_, step_count_;
  std::thread acceptor_;
  std::vector<std::thread> workers_;
};

}  // namespace osprey::bench::testing
