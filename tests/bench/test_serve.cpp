// End to end: `bench serve` against the mock streaming server, checking counts, token totals,
// that the measured TTFT / ITL / TPOT match the scripted delays, the request bodies, failures
// with their messages, the server step time, and the JSON and PNG outputs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "bench/client.h"
#include "bench/serve.h"
#include "core/error.h"
#include "mock_server.h"
#include "test_dataset.h"
#include "tokenizer/tokenizer.h"

namespace osprey::bench::testing {
namespace {

namespace fs = std::filesystem;

// Slack for a loaded 2-core CI machine: a sleep can overrun, and a chunk can wait for the client.
constexpr double kLateMs = 15;

ServeOptions base_options(const MockServer& server) {
  ServeOptions o;
  o.base_url = server.base_url();
  o.tokenizer = write_tiny_tokenizer();
  o.input_len = 40;
  o.output_len = 8;
  o.num_prompts = 12;
  o.max_concurrency = 4;
  o.progress = false;
  o.percentiles = {50, 99};
  return o;
}

TEST(ServeBench, CompletionsTimingsTokensFailuresAndOutputs) {
  MockScript script;
  script.ttft_ms = 100;
  script.itl_ms = 15;
  script.tokens_per_chunk = 2;  // 8 tokens in 4 chunks: usage, not chunks, counts tokens
  script.fail_500 = {3};
  script.drop_after_2 = {7};
  MockServer server(script);
  ServeOptions o = base_options(server);
  o.api_key = "secret";
  const fs::path dir = fs::temp_directory_path() / "osprey_bench_serve_test";
  fs::create_directories(dir);
  o.result_json = (dir / "result.json").string();
  o.plot = (dir / "plot.png").string();

  const ServeResult r = run_serve_benchmark(o);
  const ServeMetrics& m = r.metrics;
  EXPECT_EQ(r.model, "mock-model");  // the first of GET /v1/models
  EXPECT_EQ(m.completed, 10u);
  EXPECT_EQ(m.failed, 2u);
  EXPECT_EQ(m.total_output, 10 * 8);  // usage.completion_tokens, not the 4 chunks
  EXPECT_EQ(m.total_input, 10 * 40);  // the token-exact prompt lengths
  int http500 = 0, dropped = 0;
  for (const RequestResult& q : r.requests) {
    if (q.success) {
      EXPECT_EQ(q.content_chunks, 4);
      EXPECT_EQ(q.itl.size(), 3u);
      EXPECT_EQ(q.output_tokens, 8);
      continue;
    }
    http500 += q.error.find("HTTP 500") != std::string::npos &&
               q.error.find("mock failure") != std::string::npos;
    dropped += q.error.find("connection ended before the response") != std::string::npos &&
               q.error.find("after 2 content chunks") != std::string::npos;
  }
  EXPECT_EQ(http500, 1);
  EXPECT_EQ(dropped, 1);

  // TTFT: the scripted 100 ms (not 0, not 115); ITL: 15 ms; TPOT = 3 gaps / 7 tokens.
  EXPECT_GE(m.ttft_ms.median, 100 - 1);
  EXPECT_LE(m.ttft_ms.median, 100 + kLateMs);
  EXPECT_GE(m.ttft_ms.min, 100 - 1);
  EXPECT_NEAR(m.itl_ms.mean, 15, 4);
  EXPECT_NEAR(m.itl_ms.median, 15, 4);
  EXPECT_NEAR(m.tpot_ms.median, 3 * 15 / 7.0, 2);
  EXPECT_NEAR(m.e2el_ms.median, 100 + 3 * 15, kLateMs);
  EXPECT_LE(m.peak_concurrency, 4);
  EXPECT_GE(m.peak_concurrency, 3);
  // 12 requests of ~150 ms, 4 at a time: about 3 waves.
  EXPECT_GT(m.duration_s, 0.40);
  EXPECT_LT(m.duration_s, 2.0);
  EXPECT_NEAR(m.output_throughput, 80 / m.duration_s, 1e-9);

  // Server step time: the histogram moved by one 25 ms step per content chunk sent during the
  // run (its totals before the run have a 100 ms mean, which must not leak in).
  ASSERT_TRUE(m.step.has_value());
  EXPECT_DOUBLE_EQ(m.step->steps, server.content_chunks_sent());
  EXPECT_NEAR(m.step->mean_ms(), 25.0, 1e-6);
  EXPECT_NE(r.report.find("Mean step time (ms):                     25.00"), std::string::npos)
      << r.report;

  // What was sent.
  const auto tok = tokenizer::Tokenizer::load(o.tokenizer);
  const std::vector<SeenRequest> seen = server.requests();
  ASSERT_EQ(seen.size(), 12u);
  for (const SeenRequest& s : seen) {
    EXPECT_EQ(s.target, "/v1/completions");
    EXPECT_EQ(s.authorization, "Bearer secret");
    EXPECT_EQ(s.body["model"], "mock-model");
    EXPECT_EQ(s.body["max_tokens"], 8);
    EXPECT_EQ(s.body["ignore_eos"], true);
    EXPECT_EQ(s.body["stream"], true);
    EXPECT_EQ(s.body["stream_options"]["include_usage"], true);
    EXPECT_EQ(tok.encode(s.body["prompt"].get<std::string>()).size(), 40u);
  }

  // The result file.
  std::ifstream jf(o.result_json);
  const nlohmann::json j = nlohmann::json::parse(jf);
  EXPECT_EQ(j["completed"], 10);
  EXPECT_EQ(j["failed"], 2);
  EXPECT_EQ(j["total_output_tokens"], 80);
  EXPECT_EQ(j["requests"].size(), 12u);
  EXPECT_EQ(j["errors"].size(), 12u);
  EXPECT_NEAR(j["median_ttft_ms"].get<double>(), m.ttft_ms.median, 1e-9);
  EXPECT_NEAR(j["p99_itl_ms"].get<double>(), m.itl_ms.percentiles[1], 1e-9);
  EXPECT_NEAR(j["server_step"]["mean_ms"].get<double>(), 25.0, 1e-6);
  // The plot: a PNG of two panels.
  std::ifstream pf(o.plot, std::ios::binary);
  char sig[8] = {};
  pf.read(sig, 8);
  EXPECT_EQ(std::string(sig + 1, 3), "PNG");
  fs::remove_all(dir);
}

TEST(ServeBench, ChatRoleChunkIsNotATokenAndChunksCountWithoutUsage) {
  MockScript script;
  script.ttft_ms = 80;
  script.itl_ms = 10;
  script.send_usage = false;
  MockServer server(script);
  ServeOptions o = base_options(server);
  o.endpoint = "/v1/chat/completions";
  o.model = "named-model";
  o.num_prompts = 6;
  o.max_concurrency = 0;
  o.request_rate = 20;  // Poisson arrivals, ~0.25 s for 6 requests
  o.seed = 3;
  const ServeResult r = run_serve_benchmark(o);
  EXPECT_EQ(r.metrics.completed, 6u);
  EXPECT_EQ(r.metrics.total_output, 6 * 8);  // no usage: one token per content chunk
  EXPECT_GE(r.metrics.ttft_ms.min, 80 - 1);  // the role chunk comes at once: not the first token
  EXPECT_LE(r.metrics.ttft_ms.median, 80 + kLateMs);
  EXPECT_NEAR(r.metrics.itl_ms.median, 10, 4);
  for (const RequestResult& q : r.requests) EXPECT_EQ(q.generated_text.substr(0, 4), "w0 w");
  // Requests went out on the Poisson schedule, not all at once.
  double last_start = 0;
  for (const RequestResult& q : r.requests) last_start = std::max(last_start, q.start);
  EXPECT_GT(last_start, 0.02);
  for (const SeenRequest& s : server.requests()) {
    EXPECT_EQ(s.body["model"], "named-model");
    ASSERT_TRUE(s.body.contains("messages"));
    EXPECT_EQ(s.body["messages"][0]["role"], "user");
    EXPECT_FALSE(s.body.contains("prompt"));
    EXPECT_TRUE(s.authorization.empty());
  }
}

TEST(ServeBench, UnreachableServerFailsEveryRequestWithTheReason) {
  int port;
  {
    MockServer gone(MockScript{});
    port = gone.port();
  }  // closed: connections are refused now
  HttpTarget t{{"127.0.0.1", port, ""}, ""};
  RunOptions ro;
  ro.send_times = {0, 0};
  const RunOutcome out = run_requests(t, {{"{}", 1, 1}, {"{}", 1, 1}}, ro);
  ASSERT_EQ(out.results.size(), 2u);
  for (const RequestResult& q : out.results) {
    EXPECT_FALSE(q.success);
    EXPECT_NE(q.error.find("cannot connect"), std::string::npos) << q.error;
  }
  ServeOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(port);
  o.progress = false;
  EXPECT_THROW(run_serve_benchmark(o), Error);  // no --model and no /v1/models to ask
}

}  // namespace
}  // namespace osprey::bench::testing
