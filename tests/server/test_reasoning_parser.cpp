// The reasoning parsers, and the two parsers together as a chat choice uses them (ChatOutput),
// on outputs written the way DeepSeek's thinking formats write them, fed whole, split at every
// byte and one byte at a time.
#include <gtest/gtest.h>

#include "server/chat_output.h"
#include "server/reasoning_parser.h"

namespace osprey::server {
namespace {

ReasoningDelta run_pieces(ReasoningFormat f, bool thinking,
                          const std::vector<std::string_view>& pieces) {
  ReasoningParser p(f, thinking);
  ReasoningDelta r;
  auto add = [&](ReasoningDelta d) {
    r.reasoning += d.reasoning;
    r.content += d.content;
  };
  for (std::string_view s : pieces) add(p.feed(s));
  add(p.finish());
  return r;
}

void expect_any_split(ReasoningFormat f, bool thinking, std::string_view text,
                      const std::string& reasoning, const std::string& content) {
  auto check = [&](const ReasoningDelta& r, const std::string& how) {
    EXPECT_EQ(r.reasoning, reasoning) << how;
    EXPECT_EQ(r.content, content) << how;
  };
  check(run_pieces(f, thinking, {text}), "whole");
  for (size_t i = 0; i <= text.size(); ++i)
    check(run_pieces(f, thinking, {text.substr(0, i), text.substr(i)}),
          "split at " + std::to_string(i));
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  check(run_pieces(f, thinking, bytes), "byte by byte");
}

TEST(ReasoningParser, R1WithAndWithoutTheOpeningTag) {
  expect_any_split(ReasoningFormat::kDeepSeekR1, false,
                   "<think>12 + 5 = 17.\n17 * 2 = 34.</think>The answer is 34.",
                   "12 + 5 = 17.\n17 * 2 = 34.", "The answer is 34.");
  expect_any_split(ReasoningFormat::kDeepSeekR1, false, "12 + 5 = 17.</think>The answer is 17.",
                   "12 + 5 = 17.", "The answer is 17.");
}

TEST(ReasoningParser, R1UnclosedThinkingIsAllReasoning) {
  expect_any_split(ReasoningFormat::kDeepSeekR1, false, "still thinking </thi",
                   "still thinking </thi", "");
}

TEST(ReasoningParser, TextThatOnlyLooksLikeATag) {
  expect_any_split(ReasoningFormat::kDeepSeekR1, false, "<thin>x</th>y</think>z", "<thin>x</th>y",
                   "z");
}

TEST(ReasoningParser, V3FollowsTheThinkingSwitch) {
  const std::string text = "3 * 4 = 12.</think>The answer is 12.";
  expect_any_split(ReasoningFormat::kDeepSeekV3, true, text, "3 * 4 = 12.", "The answer is 12.");
  expect_any_split(ReasoningFormat::kDeepSeekV3, false, text, "", text);
  EXPECT_TRUE(ReasoningParser(ReasoningFormat::kDeepSeekV3, true).active());
  EXPECT_FALSE(ReasoningParser(ReasoningFormat::kDeepSeekV3, false).active());
  EXPECT_EQ(parse_reasoning_format("deepseek_r1"), ReasoningFormat::kDeepSeekR1);
  EXPECT_EQ(parse_reasoning_format("qwen3"), std::nullopt);
}

// A V3.2 thinking-mode answer that reasons, then calls a tool: reasoning_content, no content,
// one call, whatever the split; the streamed deltas put id and name before the arguments.
TEST(ChatOutput, ThinkingThenToolCallAnySplit) {
  const std::string text =
      "The question needs 12 * 7.</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke "
      "name=\"calculator\">\n<｜DSML｜parameter name=\"expression\" string=\"true\">12 * "
      "7</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
  ChatOutputOptions o;
  o.tool_parser = ToolCallFormat::kDeepSeekV32;
  o.reasoning_parser = ReasoningFormat::kDeepSeekV3;
  o.thinking = true;
  for (size_t i = 0; i <= text.size(); ++i) {
    int ids = 0;
    ChatOutput out(o, [&] { return "call_" + std::to_string(ids++); });
    std::vector<nlohmann::json> deltas;
    for (const std::string_view piece :
         {std::string_view(text).substr(0, i), std::string_view(text).substr(i)})
      for (auto& d : out.delta_json(out.feed(piece))) deltas.push_back(d);
    for (auto& d : out.delta_json(out.finish())) deltas.push_back(d);
    const nlohmann::json m = out.message_json();
    EXPECT_EQ(m["reasoning_content"], "The question needs 12 * 7.") << i;
    EXPECT_TRUE(m["content"].is_null()) << i;
    ASSERT_EQ(m["tool_calls"].size(), 1u) << i;
    EXPECT_EQ(m["tool_calls"][0]["id"], "call_0");
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "calculator");
    EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"expression": "12 * 7"})");
    // The last two deltas: the call's header, then its arguments.
    ASSERT_GE(deltas.size(), 2u);
    const nlohmann::json& head = deltas[deltas.size() - 2]["tool_calls"][0];
    EXPECT_EQ(head["index"], 0);
    EXPECT_EQ(head["id"], "call_0");
    EXPECT_EQ(head["function"]["name"], "calculator");
    EXPECT_EQ(head["function"]["arguments"], "");
    EXPECT_EQ(deltas.back()["tool_calls"][0]["function"]["arguments"],
              R"({"expression": "12 * 7"})");
    EXPECT_FALSE(deltas.back()["tool_calls"][0].contains("id"));
    std::string streamed_reasoning;
    for (auto& d : deltas)
      if (d.contains("reasoning_content")) streamed_reasoning += d["reasoning_content"];
    EXPECT_EQ(streamed_reasoning, "The question needs 12 * 7.") << i;
  }
}

TEST(ChatOutput, NoParsersMeansPlainContent) {
  ChatOutput out(ChatOutputOptions{}, [] { return std::string("unused"); });
  out.feed("<think>a</think>b<｜tool▁calls▁begin｜>");
  out.finish();
  const nlohmann::json m = out.message_json();
  EXPECT_EQ(m["content"], "<think>a</think>b<｜tool▁calls▁begin｜>");
  EXPECT_FALSE(m.contains("reasoning_content"));
  EXPECT_FALSE(m.contains("tool_calls"));
}

}  // namespace
}  // namespace osprey::server
