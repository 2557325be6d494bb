// The tool-call parsers on outputs written the way each DeepSeek format writes them (the
// assistant turns of the chat templates: chat.cpp renders the same markup), fed whole, split at
// every byte, one byte at a time: the content and calls must not depend on the split.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/tool_parser.h"

namespace osprey::server {
namespace {

struct Result {
  std::string content;
  std::vector<ParsedToolCall> calls;
};

void add(Result& r, ToolParseDelta d) {
  r.content += d.content;
  for (auto& c : d.calls) r.calls.push_back(std::move(c));
}

Result run_pieces(ToolCallFormat f, const std::vector<std::string_view>& pieces,
                  std::string_view assumed = {}) {
  ToolCallParser p(f);
  if (!assumed.empty()) p.assume_prefix(assumed);
  Result r;
  for (std::string_view s : pieces) add(r, p.feed(s));
  add(r, p.finish());
  return r;
}

// Checks the whole text, every two-piece split and byte-by-byte feeding against `want`.
void expect_any_split(ToolCallFormat f, std::string_view text, const std::string& want_content,
                      const std::vector<std::pair<std::string, std::string>>& want_calls,
                      std::string_view assumed = {}) {
  auto check = [&](const Result& r, const std::string& how) {
    EXPECT_EQ(r.content, want_content) << how;
    ASSERT_EQ(r.calls.size(), want_calls.size()) << how;
    for (size_t i = 0; i < want_calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].name, want_calls[i].first) << how;
      EXPECT_EQ(nlohmann::json::parse(r.calls[i].arguments),
                nlohmann::json::parse(want_calls[i].second))
          << how << ": " << r.calls[i].arguments;
    }
  };
  check(run_pieces(f, {text}, assumed), "whole");
  for (size_t i = 0; i <= text.size(); ++i)
    check(run_pieces(f, {text.substr(0, i), text.substr(i)}, assumed),
          "split at " + std::to_string(i));
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  check(run_pieces(f, bytes, assumed), "byte by byte");
}

const std::string kV3Call =
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", "
    "\"days\": 3}\n```<｜tool▁call▁end｜>";

TEST(ToolParserV3, ContentThenTwoCalls) {
  const std::string text = "Let me look that up.<｜tool▁calls▁begin｜>" + kV3Call +
                           "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```"
                           "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  expect_any_split(ToolCallFormat::kDeepSeekV3, text, "Let me look that up.",
                   {{"get_weather", R"({"city": "Paris", "days": 3})"}, {"get_time", "{}"}});
}

TEST(ToolParserV3, PlainTextIsUntouched) {
  expect_any_split(ToolCallFormat::kDeepSeekV3, "No tools needed: 2 < 3 and <b>bold</b>.",
                   "No tools needed: 2 < 3 and <b>bold</b>.", {});
}

TEST(ToolParserV3, MissingFenceIsText) {
  const std::string text =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n{\"city\": "
      "\"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  expect_any_split(ToolCallFormat::kDeepSeekV3, text, text, {});
}

TEST(ToolParserV31, TwoCalls) {
  const std::string text =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator<｜tool▁sep｜>{\"expression\": \"12 * "
      "7\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>";
  expect_any_split(ToolCallFormat::kDeepSeekV31, text, "",
                   {{"calculator", R"({"expression": "12 * 7"})"}, {"get_time", "{}"}});
}

TEST(ToolParserV31, MalformedArgumentsAreText) {
  const std::string text =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator<｜tool▁sep｜>{\"expression\": "
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  expect_any_split(ToolCallFormat::kDeepSeekV31, text, text, {});
}

TEST(ToolParserV31, GoodCallThenMalformedOne) {
  const std::string bad = "<｜tool▁call▁begin｜>oops<｜tool▁sep｜>[1, 2]<｜tool▁call▁end｜>";
  const std::string text =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{\"x\": 1}"
      "<｜tool▁call▁end｜>" +
      bad + "<｜tool▁calls▁end｜>";
  expect_any_split(ToolCallFormat::kDeepSeekV31, text, bad + "<｜tool▁calls▁end｜>",
                   {{"a", R"({"x": 1})"}});
}

TEST(ToolParserV31, UnfinishedCallIsText) {
  const std::string text =
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator<｜tool▁sep｜>{\"expr";
  expect_any_split(ToolCallFormat::kDeepSeekV31, text, text, {});
}

const std::string kV32Calls =
    "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"calculator\">\n<｜DSML｜parameter "
    "name=\"expression\" string=\"true\">12 * 7 + \"x\"</｜DSML｜parameter>\n<｜DSML｜parameter "
    "name=\"precision\" string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke "
    "name=\"lookup\">\n<｜DSML｜parameter name=\"tags\" string=\"false\">[\"a\", "
    "{\"b\": null}]</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";

TEST(ToolParserV32, ContentThenCalls) {
  expect_any_split(ToolCallFormat::kDeepSeekV32, "I will compute it." + kV32Calls,
                   "I will compute it.",
                   {{"calculator", R"({"expression": "12 * 7 + \"x\"", "precision": 2})"},
                    {"lookup", R"({"tags": ["a", {"b": null}]})"}});
}

TEST(ToolParserV32, ArgumentsKeepTheirOrderAndPythonSpacing) {
  ToolCallParser p(ToolCallFormat::kDeepSeekV32);
  ToolParseDelta d = p.feed(kV32Calls);
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].arguments, R"({"expression": "12 * 7 + \"x\"", "precision": 2})");
  EXPECT_EQ(d.calls[1].arguments, R"({"tags": ["a", {"b": null}]})");
}

TEST(ToolParserV32, NewlinesWithoutCallsAreContent) {
  expect_any_split(ToolCallFormat::kDeepSeekV32, "Line one.\n\nLine two <b>.\n\n",
                   "Line one.\n\nLine two <b>.\n\n", {});
}

TEST(ToolParserV32, NonJsonNonStringValueIsAString) {
  const std::string text =
      "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" "
      "string=\"false\">twelve</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
  expect_any_split(ToolCallFormat::kDeepSeekV32, text, "", {{"f", R"({"n": "twelve"})"}});
}

TEST(ToolParserV32, MalformedParameterIsText) {
  const std::string text =
      "Hm.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter "
      "name=\"n\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
  // The invoke is given back; the closing tag after it is read as text again.
  expect_any_split(ToolCallFormat::kDeepSeekV32, text, text, {});
}

TEST(ToolParserV32, CutOffInsideACallIsText) {
  const std::string text =
      "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜par";
  expect_any_split(ToolCallFormat::kDeepSeekV32, text, text, {});
}

TEST(ToolParser, ForcedPrefixIsAssumedNotReturned) {
  const std::string name = "calculator";
  for (ToolCallFormat f :
       {ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31, ToolCallFormat::kDeepSeekV32}) {
    const std::string named = ToolCallParser::forced_prefix(f, &name);
    const std::string rest =
        f == ToolCallFormat::kDeepSeekV3
            ? "{\"expression\": \"3 + 4\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        : f == ToolCallFormat::kDeepSeekV31
            ? "{\"expression\": \"3 + 4\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            : "<｜DSML｜parameter name=\"expression\" string=\"true\">3 + "
              "4</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
    SCOPED_TRACE(std::string(tool_call_format_name(f)));
    expect_any_split(f, rest, "", {{"calculator", R"({"expression": "3 + 4"})"}}, named);
    // A continuation that breaks the call comes back without the assumed markup.
    const std::string end_tag =
        f == ToolCallFormat::kDeepSeekV32 ? "</｜DSML｜invoke>" : "<｜tool▁call▁end｜>";
    expect_any_split(f, "no call" + end_tag, "no call" + end_tag, {}, named);
  }
}

TEST(ToolParser, Names) {
  EXPECT_EQ(parse_tool_call_format("deepseek_v32"), ToolCallFormat::kDeepSeekV32);
  EXPECT_EQ(parse_tool_call_format("deepseek_v31"), ToolCallFormat::kDeepSeekV31);
  EXPECT_EQ(parse_tool_call_format("deepseek_v3"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(parse_tool_call_format("hermes"), std::nullopt);
  EXPECT_EQ(tool_call_format_name(ToolCallFormat::kDeepSeekV31), "deepseek_v31");
}

}  // namespace
}  // namespace osprey::server
