#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "tiny_tokenizer.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/utf8.h"

namespace osprey::tokenizer {
namespace {

using testing::added_token;
using testing::tiny_tokenizer;
using testing::TinySpec;
using Ids = std::vector<TokenId>;

Tokenizer byte_tokens() {
  TinySpec spec;
  // json::array: a braced list of one json is a copy under clang, an array under gcc.
  spec.added_tokens = nlohmann::json::array({added_token(300, "<eos>")});
  return Tokenizer::from_json(tiny_tokenizer(spec).dump());
}

TEST(Detokenizer, HoldsASplitCharacterUntilComplete) {
  const Tokenizer tok = byte_tokens();
  IncrementalDetokenizer detok(tok);
  // "😀" = F0 9F 98 80, one byte per token.
  EXPECT_EQ(detok.step('a'), "a");
  EXPECT_EQ(detok.step(0xF0), "");
  EXPECT_EQ(detok.step(0x9F), "");
  EXPECT_EQ(detok.pending_bytes(), 2u);
  EXPECT_EQ(detok.step(0x98), "");
  EXPECT_EQ(detok.step(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(detok.pending_bytes(), 0u);
  EXPECT_EQ(detok.finish(), "");
}

TEST(Detokenizer, InvalidBytesAndUnfinishedEnd) {
  const Tokenizer tok = byte_tokens();
  IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.step(0xC3), "");
  EXPECT_EQ(detok.step('x'), "\xEF\xBF\xBDx");  // the held byte turned out invalid
  EXPECT_EQ(detok.step(0xE2), "");
  EXPECT_EQ(detok.step(300), "\xEF\xBF\xBD<eos>");
  EXPECT_EQ(detok.step(0xE2), "");
  EXPECT_EQ(detok.finish(), "\xEF\xBF\xBD");
}

TEST(Detokenizer, UnknownIdThrowsAndKeepsState) {
  const Tokenizer tok = byte_tokens();
  IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.step(0xC3), "");
  EXPECT_THROW(detok.step(999), Error);
  EXPECT_EQ(detok.step(0xA9), "\xC3\xA9");
}

TEST(Detokenizer, DeltasAreValidAndAddUpToDecode) {
  const Tokenizer tok = byte_tokens();
  std::mt19937 rng(3);
  // Mostly UTF-8 lead/continuation bytes, so characters split and break in every way.
  const Ids alphabet = {'a', ' ', 0xC3, 0xA9, 0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 0xFF, 300};
  for (int trial = 0; trial < 500; ++trial) {
    Ids ids(rng() % 24);
    for (auto& id : ids) id = alphabet[rng() % alphabet.size()];
    IncrementalDetokenizer detok(tok);
    std::string streamed;
    for (TokenId id : ids) {
      const std::string delta = detok.step(id);
      ASSERT_TRUE(utf8_is_valid(delta));
      streamed += delta;
    }
    streamed += detok.finish();
    ASSERT_EQ(streamed, tok.decode(ids));
  }
}

TEST(Detokenizer, SkipsSpecialTokensWhenAsked) {
  const Tokenizer tok = byte_tokens();
  DecodeOptions skip;
  skip.skip_special_tokens = true;
  IncrementalDetokenizer detok(tok, skip);
  EXPECT_EQ(detok.step(Ids{'h', 300, 'i'}), "hi");
}

}  // namespace
}  // namespace osprey::tokenizer
