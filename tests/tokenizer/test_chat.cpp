#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "deepseek_tokenizer.h"
#include "tiny_tokenizer.h"
#include "tokenizer/chat.h"
#include "tokenizer/python_json.h"

namespace osprey::tokenizer {
namespace {

using nlohmann::json;
using testing::deepseek_v3;
using Ids = std::vector<TokenId>;

const std::vector<ChatMessage> kConversation = {
    {"system", "You are helpful."}, {"user", "Hi"},   {"assistant", "Let me think.</think>Hello!"},
    {"system", "Be brief."},        {"user", "2+2?"},
};

TEST(Chat, DeepSeekV3Format) {
  const ChatEncoder chat(deepseek_v3(), ChatFormat::kDeepSeekV3);
  EXPECT_EQ(chat.render(kConversation),
            "<｜begin▁of▁sentence｜>You are helpful.\n\nBe brief.<｜User｜>Hi<｜Assistant｜>Let me "
            "think.</think>Hello!<｜end▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜>");
  const Ids ids = chat.encode(kConversation);
  EXPECT_EQ(ids, deepseek_v3().encode(chat.render(kConversation)));
  EXPECT_EQ(ids.front(), 0);
  EXPECT_EQ(ids.back(), 128804);
  ChatOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(chat.encode(kConversation, no_prompt), Ids(ids.begin(), ids.end() - 1));
}

TEST(Chat, DeepSeekV31ThinkingSwitch) {
  const ChatEncoder chat(deepseek_v3(), ChatFormat::kDeepSeekV31);
  ChatOptions thinking;
  thinking.thinking = true;
  const std::string history =
      "<｜begin▁of▁sentence｜>You are helpful.\n\nBe brief.<｜User｜>Hi<｜Assistant｜></think>"
      "Hello!<｜end▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜>";
  EXPECT_EQ(chat.render(kConversation), history + "</think>");
  EXPECT_EQ(chat.render(kConversation, thinking), history + "<think>");
  // This (V3) tokenizer has no <think> token: the tags are text, as in a rendered prompt.
  EXPECT_EQ(chat.encode(kConversation, thinking),
            deepseek_v3().encode(chat.render(kConversation, thinking)));
  // No generation prompt after an assistant turn.
  const std::vector<ChatMessage> answered = {{"user", "q"}, {"assistant", "a"}};
  EXPECT_EQ(chat.render(answered),
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>a<｜end▁of▁sentence｜>");
}

TEST(Chat, ThinkTokensAreUsedWhenTheTokenizerHasThem) {
  testing::TinySpec spec;
  spec.added_tokens = {testing::added_token(300, "<｜User｜>"),
                       testing::added_token(301, "<｜Assistant｜>"),
                       testing::added_token(302, "<｜end▁of▁sentence｜>"),
                       testing::added_token(303, "<think>"), testing::added_token(304, "</think>")};
  const Tokenizer tok = Tokenizer::from_json(testing::tiny_tokenizer(spec).dump());
  const ChatEncoder chat(tok, ChatFormat::kDeepSeekV31);
  ChatOptions thinking;
  thinking.thinking = true;
  EXPECT_EQ(chat.encode({{{"user", "q"}}}, thinking), (Ids{300, 'q', 301, 303}));
  EXPECT_EQ(chat.encode({{{"user", "q"}}}), (Ids{300, 'q', 301, 304}));
}

TEST(Chat, SimpleFormat) {
  const Tokenizer tok = Tokenizer::from_json(testing::tiny_tokenizer({}).dump());
  const ChatEncoder chat(tok, ChatFormat::kSimple);
  EXPECT_EQ(chat.render({{{"system", "s"}, {"user", "u"}, {"assistant", "a"}, {"user", "v"}}}),
            "System: s\n\nUser: u\n\nAssistant: a\n\nUser: v\n\nAssistant:");
}

TEST(Chat, Errors) {
  const ChatEncoder chat(deepseek_v3(), ChatFormat::kDeepSeekV3);
  EXPECT_THROW(chat.encode({{{"function", "x"}}}), Error);  // an unknown role
  ChatMessage user_with_calls("user", "x");
  user_with_calls.tool_calls.push_back({"id", "function", "f", "{}"});
  EXPECT_THROW(chat.encode(std::vector<ChatMessage>{user_with_calls}), Error);
  const Tokenizer plain = Tokenizer::from_json(testing::tiny_tokenizer({}).dump());
  EXPECT_THROW(ChatEncoder(plain, ChatFormat::kDeepSeekV3), Error);
  EXPECT_THROW(parse_chat_messages(json::parse(R"([{"content": "no role"}])")), Error);
  EXPECT_THROW(parse_chat_messages(json::parse(R"({"role": "user"})")), Error);
}

TEST(Chat, FormatDetection) {
  const Tokenizer& ds = deepseek_v3();
  // The V3 package's tokenizer_config.json has the V3 template.
  EXPECT_EQ(detect_chat_format(testing::deepseek_v3_dir(), ds), ChatFormat::kDeepSeekV3);
  EXPECT_EQ(detect_chat_format(json{{"model_type", "deepseek_v32"}}, json::object(), ds),
            ChatFormat::kDeepSeekV32);
  EXPECT_EQ(detect_chat_format(json::object(),
                               json{{"chat_template", "{{'<｜Assistant｜></think>'}}"}}, ds),
            ChatFormat::kDeepSeekV31);
  EXPECT_EQ(detect_chat_format(json::object(), json::object(), ds), ChatFormat::kDeepSeekV3);
  const Tokenizer plain = Tokenizer::from_json(testing::tiny_tokenizer({}).dump());
  EXPECT_EQ(detect_chat_format(json::object(), json::object(), plain), ChatFormat::kSimple);
  EXPECT_EQ(parse_chat_format("deepseek-v3.2"), ChatFormat::kDeepSeekV32);
  EXPECT_EQ(parse_chat_format("deepseek-v3.1"), ChatFormat::kDeepSeekV31);
  EXPECT_EQ(parse_chat_format("deepseek-r1"), ChatFormat::kDeepSeekV3);
  EXPECT_EQ(parse_chat_format("llama"), std::nullopt);
}

// DeepSeek-V3.2 has no Jinja template: its prompts come from encoding/encoding_dsv32.py, so these
// expected strings are derived by hand from that script's text (TOOLS_SYSTEM_TEMPLATE,
// render_message, encode_messages as vLLM's vllm/tokenizers/deepseek_v32_encoding.py and SGLang's
// entrypoints/openai/encoding_dsv32.py copy it) and from vLLM's DeepSeek-V3.2 tokenizer, which
// puts the request's tools in a system message of their own at the front.
const std::string kBos = "<｜begin▁of▁sentence｜>";
const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string kCalculator =
    R"({"name": "calculator", "description": "Evaluates an arithmetic expression.", )"
    R"("parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, )"
    R"("required": ["expression"]}})";

std::string v32_tools_block(const std::string& schemas) {
  return "\n\n## Tools\n"
         "You have access to a set of tools you can use to answer the user's question.\n"
         "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the "
         "following as part of your reply to the user:\n"
         "<｜DSML｜function_calls>\n"
         "<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
         "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
         "</｜DSML｜parameter>\n"
         "...\n"
         "</｜DSML｜invoke>\n"
         "<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n"
         "...\n"
         "</｜DSML｜invoke>\n"
         "</｜DSML｜function_calls>\n"
         "String and scalar parameters should be specified as is without any escaping or quotes, "
         "while lists and objects should use JSON format. The \"string\" attribute should be set "
         "to \"true\" for string type parameters and \"false\" for other types (numbers, "
         "booleans, arrays, objects).\n"
         "If the thinking_mode is enabled, then after function results you should strongly "
         "consider outputting a thinking block. Here is an example:\n"
         "<｜DSML｜function_calls>\n"
         "...\n"
         "</｜DSML｜function_calls>\n"
         "<function_results>\n"
         "...\n"
         "</function_results>\n"
         "<think>...thinking about results</think>\n"
         "Here are the functions available in JSONSchema format:\n"
         "<functions>\n" +
         schemas + "\n</functions>\n";
}

ChatMessage calls(std::vector<ChatToolCall> c, std::string reasoning = "") {
  ChatMessage m("assistant", "");
  m.content_is_null = true;
  m.tool_calls = std::move(c);
  m.reasoning_content = std::move(reasoning);
  return m;
}

const std::string kCall12x7 =
    "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"calculator\">\n<｜DSML｜parameter "
    "name=\"expression\" string=\"true\">12 * 7</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
    "</｜DSML｜function_calls>";

TEST(ChatV32, ToolsComeFirstAndTheSystemPromptFollows) {
  const ChatEncoder chat(deepseek_v3(), ChatFormat::kDeepSeekV32);
  ChatOptions o;
  o.tools = {kCalculator};
  const std::vector<ChatMessage> m = {{"system", "You are a calculator."},
                                      {"user", "What is 12 * 7?"}};
  EXPECT_EQ(chat.render(m, o), kBos + v32_tools_block(kCalculator) +
                                   "You are a calculator.<｜User｜>What is 12 * 7?<｜Assistant｜>"
                                   "</think>");
  EXPECT_EQ(chat.encode(m, o), deepseek_v3().encode(chat.render(m, o)));
}

TEST(ChatV32, ToolRoundTripChatMode) {
  const ChatEncoder chat(deepseek_v3(), ChatFormat::kDeepSeekV32);
  ChatOptions o;
  o.tools = {kCalculator};
  std::vector<ChatMessage> m = {
      {"user", "What is 12 * 7?"},
      calls({{"call_1", "function", "calculator", R"({"expression": "12 * 7"})"}}),
      {"tool", "84"}};
  const std::string prefix = kBos + v32_tools_block(kCalculator) +
                             "<｜User｜>What is 12 * 7?<｜Assistant｜></think>" + kCall12x7 + kEos +
                             "\n\n<function_results>\n<result>84</result>\n</function_results>"
                             "\n\n</think>";
  EXPECT_EQ(chat.render(m, o), prefix);
  m.push_back({"assistant", "The answer is 84."});
  EXPECT_EQ(chat.render(m, o), prefix + "The answer is 84." + kEos);
}

TEST(ChatV32, ThinkingModeRoundTripAndNonStringArguments) {
  const ChatEncoder chat(deepseek_v3(), ChatFormat::kDeepSeekV32);
  ChatOptions o;
  o.thinking = true;
  const std::vector<ChatMessage> m = {
      {"user", "q"},
      calls({{"a", "function", "f", R"({"b": [1, "x"], "a": 1.5, "c": true, "s": "t"})"},
             {"b", "function", "g", "{}"}},
            "I need f and g."),
      {"tool", "r1"},
      {"tool", "r2"}};
  EXPECT_EQ(chat.render(m, o),
            kBos +
                "<｜User｜>q<｜Assistant｜><think>I need f and g.</think>\n\n"
                "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n"
                "<｜DSML｜parameter name=\"b\" string=\"false\">[1, \"x\"]</｜DSML｜parameter>\n"
                "<｜DSML｜parameter name=\"a\" string=\"false\">1.5</｜DSML｜parameter>\n"
                "<｜DSML｜parameter name=\"c\" string=\"false\">true</｜DSML｜parameter>\n"
                "<｜DSML｜parameter name=\"s\" string=\"true\">t</｜DSML｜parameter>\n"
                "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n\n</｜DSML｜invoke>\n"
                "</｜DSML｜function_calls>" +
                kEos +
                "\n\n<function_results>\n<result>r1</result>\n<result>r2</result>\n"
                "</function_results>\n\n<think>");
}

TEST(ChatV32, MultiTurnAndThinkingOnlyOnTheLastUserTurn) {
  const ChatEncoder chat(deepseek_v3(), ChatFormat::kDeepSeekV32);
  ChatMessage earlier("assistant", "Hello!");
  earlier.reasoning_content = "dropped: before the last user turn";
  const std::vector<ChatMessage> m = {{"user", "Hi"}, earlier, {"user", "2+2?"}};
  const std::string history =
      kBos + "<｜User｜>Hi<｜Assistant｜></think>Hello!" + kEos + "<｜User｜>2+2?<｜Assistant｜>";
  EXPECT_EQ(chat.render(m), history + "</think>");
  ChatOptions thinking;
  thinking.thinking = true;
  EXPECT_EQ(chat.render(m, thinking), history + "<think>");
  // Two user turns in a row: each ends in the assistant opener (unlike V3.1).
  const std::vector<ChatMessage> two = {{"user", "a"}, {"user", "b"}};
  EXPECT_EQ(chat.render(two),
            kBos + "<｜User｜>a<｜Assistant｜></think><｜User｜>b<｜Assistant｜></think>");
}

TEST(ChatV32, Errors) {
  const ChatEncoder chat(deepseek_v3(), ChatFormat::kDeepSeekV32);
  ChatOptions thinking;
  thinking.thinking = true;
  // Thinking mode: an answer after the last user turn needs its reasoning (or tool calls).
  EXPECT_THROW(chat.render(std::vector<ChatMessage>{{"user", "q"}, {"assistant", "a"}}, thinking),
               Error);
  EXPECT_THROW(chat.render(std::vector<ChatMessage>{{"user", "q"}, {"tool", "orphan"}}), Error);
  EXPECT_THROW(
      chat.render(std::vector<ChatMessage>{{"user", "q"}, calls({{"x", "function", "f", "[1]"}})}),
      Error);
  EXPECT_THROW(
      chat.render(std::vector<ChatMessage>{{"user", "q"}, calls({{"x", "function", "f", "{"}})}),
      Error);
}

// V3 / V3.1 tool conversations are checked byte for byte against their Jinja templates by the
// reference test (tools/tokenizer/reference_chat.mjs); here one of each, for reading.
TEST(ChatTools, DeepSeekV3AndV31Markup) {
  const std::vector<ChatMessage> m = {
      {"user", "Weather?"},
      calls({{"c1", "function", "get_weather", R"({"city": "Paris"})"}}),
      {"tool", "sunny"}};
  EXPECT_EQ(
      ChatEncoder(deepseek_v3(), ChatFormat::kDeepSeekV3).render(m),
      kBos +
          "<｜User｜>Weather?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
          "<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>"
          "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>"
          "<｜tool▁outputs▁end｜>");
  EXPECT_EQ(
      ChatEncoder(deepseek_v3(), ChatFormat::kDeepSeekV31).render(m),
      kBos +
          "<｜User｜>Weather?<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
          "get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>" +
          kEos + "<｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>");
}

TEST(PythonJson, MatchesJsonDumps) {
  using oj = nlohmann::ordered_json;
  // Expected strings: Python 3's json.dumps(value, ensure_ascii=False) of the same values.
  EXPECT_EQ(python_json_dumps(oj::parse(R"({"b": 1, "a": [true, null, "x"], "é": "ü\n\"\u0001"})")),
            "{\"b\": 1, \"a\": [true, null, \"x\"], \"é\": \"ü\\n\\\"\\u0001\"}");
  EXPECT_EQ(python_json_dumps(
                oj::parse("[0.1, 1.5, 100.0, 1e-05, 0.0001, 1e16, 1e15, -2.5e-07, 12345678.9]")),
            "[0.1, 1.5, 100.0, 1e-05, 0.0001, 1e+16, 1000000000000000.0, -2.5e-07, 12345678.9]");
  EXPECT_EQ(python_json_dumps(oj::parse("{}")), "{}");
  EXPECT_EQ(python_json_dumps(oj::parse("[]")), "[]");
}

}  // namespace
}  // namespace osprey::tokenizer
