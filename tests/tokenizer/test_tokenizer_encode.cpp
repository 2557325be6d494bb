#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace osprey::tokenizer {
namespace {

using testing::tiny_tokenizer;
using testing::TinySpec;
using Ids = std::vector<TokenId>;

Tokenizer gpt2_like() {
  TinySpec spec;
  spec.merges = {{" ", "t"}, {"h", "e"}, {" t", "he"}, {"\xC3", "\xA9"}};  // " the" = 258, é = 259
  return Tokenizer::from_json(tiny_tokenizer(spec).dump());
}

TEST(Encode, InvalidUtf8IsAnErrorWithTheOffset) {
  const Tokenizer tok = gpt2_like();
  try {
    tok.encode("ok \xC3(");
    FAIL() << "invalid UTF-8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset 3"), std::string::npos) << e.what();
  }
}

TEST(Encode, EmptyAndRoundTrip) {
  const Tokenizer tok = gpt2_like();
  EXPECT_TRUE(tok.encode("").empty());
  const Ids ids = tok.encode("in the café");
  EXPECT_EQ(ids, (Ids{'i', 'n', 258, ' ', 'c', 'a', 'f', 259}));
  EXPECT_EQ(tok.decode(ids), "in the café");
}

TEST(Decode, UnknownIdIsAnError) {
  const Tokenizer tok = gpt2_like();
  EXPECT_THROW(tok.decode(Ids{'a', 260}), Error);
  EXPECT_THROW(tok.decode(Ids{-1}), Error);
  EXPECT_THROW(tok.token_bytes(1 << 30), Error);
  EXPECT_FALSE(tok.is_known(260));
  EXPECT_TRUE(tok.is_known(259));
}

TEST(Decode, InvalidBytesBecomeReplacementCharacters) {
  const Tokenizer tok = gpt2_like();
  // Half of "é" then ASCII, and a lone continuation byte.
  EXPECT_EQ(tok.decode(Ids{0xC3, 'x', 0xA9}), "\xEF\xBF\xBDx\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode(Ids{0xC3}), "\xEF\xBF\xBD");
}

TEST(Encode, ConcurrentCallsMatchSerialOnes) {
  const Tokenizer tok = gpt2_like();
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back("the text number " + std::to_string(i) + " café");
  std::vector<Ids> serial;
  for (const auto& t : texts) serial.push_back(tok.encode(t));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) mismatches += tok.encode(texts[i]) != serial[i];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Encode, NormalizerRunsBeforePreTokenization) {
  TinySpec spec;
  spec.normalizer = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "NFKC"}}, {{"type", "Lowercase"}}}}};
  const Tokenizer tok = Tokenizer::from_json(tiny_tokenizer(spec).dump());
  // Full-width "Ａ" -> "A" (NFKC) -> "a" (Lowercase); "ﬁ" -> "fi".
  EXPECT_EQ(tok.encode("Ａﬁ"), (Ids{'a', 'f', 'i'}));
}

}  // namespace
}  // namespace osprey::tokenizer
