// The text formats the client reads: server-sent events, base URLs and Prometheus exposition.
#include <gtest/gtest.h>

#include "bench/prometheus.h"
#include "bench/sse.h"
#include "bench/url.h"
#include "core/error.h"

namespace osprey::bench {
namespace {

TEST(Sse, EventsSplitAnywhereAcrossReads) {
  const std::string stream =
      ": comment\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: line1\ndata: line2\nid: 3\n\n"
      "data:nospace\n\ndata: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "line1\nline2", "nospace", "[DONE]"};
  for (size_t cut = 1; cut < stream.size(); ++cut) {  // every split point, and byte by byte
    SseParser p;
    std::vector<std::string> got;
    p.feed(std::string_view(stream).substr(0, cut), got);
    p.feed(std::string_view(stream).substr(cut), got);
    p.finish(got);
    ASSERT_EQ(got, want) << "cut at " << cut;
  }
  SseParser p;
  std::vector<std::string> got;
  for (char c : stream) p.feed(std::string_view(&c, 1), got);
  EXPECT_EQ(got, want);
}

TEST(Sse, UnterminatedLastEventIsDeliveredAtFinish) {
  SseParser p;
  std::vector<std::string> got;
  p.feed("data: tail", got);
  EXPECT_TRUE(got.empty());
  p.finish(got);
  EXPECT_EQ(got, std::vector<std::string>{"tail"});
}

TEST(Url, Parts) {
  BaseUrl b = parse_base_url("http://example.org:8080/api/");
  EXPECT_EQ(b.host, "example.org");
  EXPECT_EQ(b.port, 8080);
  EXPECT_EQ(b.prefix, "/api");
  b = parse_base_url("http://localhost");
  EXPECT_EQ(b.port, 80);
  EXPECT_EQ(b.prefix, "");
  b = parse_base_url("http://[::1]:9000");
  EXPECT_EQ(b.host, "::1");
  EXPECT_EQ(b.port, 9000);
  EXPECT_THROW(parse_base_url("https://x"), Error);
  EXPECT_THROW(parse_base_url("http://x:99999"), Error);
  EXPECT_THROW(parse_base_url("http://x:12ab"), Error);
}

TEST(Prometheus, HistogramTotalsSumOverLabels) {
  const std::string text =
      "# HELP osprey_step_duration_seconds step time\n"
      "# TYPE osprey_step_duration_seconds histogram\n"
      "osprey_step_duration_seconds_bucket{le=\"0.1\"} 5\n"
      "osprey_step_duration_seconds_sum{kind=\"decode\"} 1.5\n"
      "osprey_step_duration_seconds_count{kind=\"decode\"} 30\n"
      "osprey_step_duration_seconds_sum{kind=\"prefill\"} 2.5e-1\n"
      "osprey_step_duration_seconds_count{kind=\"prefill\"} 2\n"
      "osprey_step_duration_seconds_sumother 99\n"
      "other_step_duration_seconds_sum 77\n";
  const auto h = find_histogram(text, kStepHistogram);
  ASSERT_TRUE(h.has_value());
  EXPECT_DOUBLE_EQ(h->sum, 1.75);
  EXPECT_DOUBLE_EQ(h->count, 32);
  EXPECT_FALSE(find_histogram("vllm:e2e_request_latency_seconds_sum 3\n", kStepHistogram));
}

}  // namespace
}  // namespace osprey::bench
