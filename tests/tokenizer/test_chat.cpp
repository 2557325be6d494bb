#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "deepseek_tokenizer.h"
#include "tiny_tokenizer.h"
#include "tokenizer/chat.h"

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
  EXPECT_THROW(chat.encode({{{"tool", "x"}}}), Error);
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
            ChatFormat::kDeepSeekV31);
  EXPECT_EQ(detect_chat_format(json::object(),
                               json{{"chat_template", "{{'<｜Assistant｜></think>'}}"}}, ds),
            ChatFormat::kDeepSeekV31);
  EXPECT_EQ(detect_chat_format(json::object(), json::object(), ds), ChatFormat::kDeepSeekV3);
  const Tokenizer plain = Tokenizer::from_json(testing::tiny_tokenizer({}).dump());
  EXPECT_EQ(detect_chat_format(json::object(), json::object(), plain), ChatFormat::kSimple);
  EXPECT_EQ(parse_chat_format("deepseek-v3.2"), ChatFormat::kDeepSeekV31);
  EXPECT_EQ(parse_chat_format("deepseek-r1"), ChatFormat::kDeepSeekV3);
  EXPECT_EQ(parse_chat_format("llama"), std::nullopt);
}

}  // namespace
}  // namespace osprey::tokenizer
