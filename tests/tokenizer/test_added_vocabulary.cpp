#include <gtest/gtest.h>

#include "tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace osprey::tokenizer {
namespace {

using nlohmann::json;
using testing::added_token;
using testing::tiny_tokenizer;
using testing::TinySpec;
using Ids = std::vector<TokenId>;

Tokenizer with_added(json added, std::string config = {}) {
  TinySpec spec;
  spec.added_tokens = std::move(added);
  return Tokenizer::from_json(tiny_tokenizer(spec).dump(), config);
}

TEST(AddedVocabulary, LongestMatchAtTheLeftmostPosition) {
  const Tokenizer tok =
      with_added({added_token(300, "<a>"), added_token(301, "<a><b>"), added_token(302, "b>")});
  EXPECT_EQ(tok.encode("<a><b>"), (Ids{301}));
  EXPECT_EQ(tok.encode("x<a>y"), (Ids{'x', 300, 'y'}));
  EXPECT_EQ(tok.encode("<a><c"), (Ids{300, '<', 'c'}));
  EXPECT_EQ(tok.encode("<a b>"), (Ids{'<', 'a', ' ', 302}));
}

TEST(AddedVocabulary, LiteralModeIgnoresThem) {
  // (json::array: a braced list of one json is a copy under clang, an array under gcc.)
  const Tokenizer tok = with_added(json::array({added_token(300, "<a>")}));
  EncodeOptions literal;
  literal.parse_added_tokens = false;
  EXPECT_EQ(tok.encode("<a>", literal), (Ids{'<', 'a', '>'}));
}

TEST(AddedVocabulary, LstripAndRstripTakeTheWhitespace) {
  const Tokenizer tok = with_added({added_token(300, "<m>", true, /*lstrip=*/true, false),
                                    added_token(301, "<n>", true, false, /*rstrip=*/true)});
  EXPECT_EQ(tok.encode("a  <m> b"), (Ids{'a', 300, ' ', 'b'}));
  EXPECT_EQ(tok.encode("a <n>  b"), (Ids{'a', ' ', 301, 'b'}));
}

TEST(AddedVocabulary, SpecialFlagsAndDecodeSkipping) {
  const Tokenizer tok =
      with_added({added_token(300, "<s>", true), added_token(301, "word", false)});
  EXPECT_TRUE(tok.is_special(300));
  EXPECT_FALSE(tok.is_special(301));
  EXPECT_FALSE(tok.is_special('a'));
  const Ids ids = tok.encode("<s>a word");
  EXPECT_EQ(ids, (Ids{300, 'a', ' ', 301}));
  EXPECT_EQ(tok.decode(ids), "<s>a word");
  DecodeOptions skip;
  skip.skip_special_tokens = true;
  EXPECT_EQ(tok.decode(ids, skip), "a word");
  EXPECT_EQ(tok.token_to_id("<s>"), 300);
  EXPECT_EQ(tok.token_to_id("\xC4\xA0"), ' ');  // "Ġ" is the space byte's vocabulary entry
  EXPECT_EQ(tok.token_to_id("nope"), std::nullopt);
}

TEST(AddedVocabulary, BosFromTokenizerConfig) {
  const std::string config = R"({"add_bos_token": true, "add_eos_token": false,
      "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>"})";
  const Tokenizer tok = with_added({added_token(300, "<s>"), added_token(301, "</s>")}, config);
  EXPECT_EQ(tok.bos_id(), 300);
  EXPECT_EQ(tok.eos_id(), 301);
  EncodeOptions with_special;
  with_special.add_special_tokens = true;
  EXPECT_EQ(tok.encode("hi", with_special), (Ids{300, 'h', 'i'}));
  EXPECT_EQ(tok.encode("hi"), (Ids{'h', 'i'}));
}

TEST(AddedVocabulary, TemplatePostProcessorWithoutConfigFlags) {
  TinySpec spec;
  spec.added_tokens = {added_token(300, "<s>"), added_token(301, "</s>")};
  spec.post_processor = {{"type", "TemplateProcessing"},
                         {"single",
                          {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                           {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
                         {"special_tokens",
                          {{"<s>", {{"id", "<s>"}, {"ids", {300}}, {"tokens", {"<s>"}}}},
                           {"</s>", {{"id", "</s>"}, {"ids", {301}}, {"tokens", {"</s>"}}}}}}};
  const Tokenizer tok = Tokenizer::from_json(tiny_tokenizer(spec).dump());
  EncodeOptions with_special;
  with_special.add_special_tokens = true;
  EXPECT_EQ(tok.encode("x", with_special), (Ids{300, 'x', 301}));
}

}  // namespace
}  // namespace osprey::tokenizer
