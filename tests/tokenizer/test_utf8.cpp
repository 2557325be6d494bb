#include <gtest/gtest.h>

#include "tokenizer/utf8.h"

namespace osprey::tokenizer {
namespace {

std::string lossy(std::string_view bytes) {
  std::string out;
  append_utf8_lossy(bytes, out);
  return out;
}

TEST(Utf8, FirstInvalidFindsTheOffendingByte) {
  EXPECT_EQ(utf8_first_invalid("plain ascii text, long enough for the 8-byte path"),
            std::string_view::npos);
  EXPECT_EQ(utf8_first_invalid("h\xC3\xA9llo \xF0\x9F\x98\x80"), std::string_view::npos);
  EXPECT_EQ(utf8_first_invalid("abc\xFF"), 3u);           // never valid
  EXPECT_EQ(utf8_first_invalid("ab\xC0\xAF"), 2u);        // overlong '/'
  EXPECT_EQ(utf8_first_invalid("a\xED\xA0\x80"), 1u);     // surrogate U+D800
  EXPECT_EQ(utf8_first_invalid("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8_first_invalid("12345678\xE2\x82"), 8u);  // truncated at the end
  EXPECT_EQ(utf8_first_invalid("x\x80"), 1u);             // lone continuation
}

TEST(Utf8, LossyReplacesEachMaximalSubpart) {
  EXPECT_EQ(lossy("ok"), "ok");
  // A truncated 4-byte sequence is one maximal subpart: one U+FFFD.
  EXPECT_EQ(lossy("a\xF0\x9F\x98"), "a\xEF\xBF\xBD");
  // E0 80: 80 is not allowed after E0, so E0 and 80 are two subparts.
  EXPECT_EQ(lossy("\xE0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  // A valid prefix interrupted by ASCII: one U+FFFD, then the ASCII.
  EXPECT_EQ(lossy("\xE2\x82z"), "\xEF\xBF\xBDz");
  EXPECT_EQ(lossy("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Utf8, StepClassifiesTruncatedPrefixes) {
  EXPECT_EQ(utf8_step("\xF0\x9F").status, Utf8Status::kTruncated);
  EXPECT_EQ(utf8_step("\xF0\x9F").length, 2u);
  EXPECT_EQ(utf8_step("\xC3\xA9").status, Utf8Status::kComplete);
  EXPECT_EQ(utf8_step("\xC3\xA9").length, 2u);
  EXPECT_EQ(utf8_step("\xF0\x8F").status, Utf8Status::kInvalid);  // overlong 4-byte
  EXPECT_EQ(utf8_step("\xF0\x8F").length, 1u);
}

TEST(Utf8, EncodeDecodeCodePoints) {
  for (char32_t cp : {U'A', U'\u00E9', U'\u4E2D', U'\U0001F600', U'\U0010FFFF'}) {
    std::string s;
    append_utf8(cp, s);
    size_t len = 0;
    EXPECT_EQ(decode_utf8(s, len), cp);
    EXPECT_EQ(len, s.size());
    EXPECT_TRUE(utf8_is_valid(s));
  }
  EXPECT_EQ(utf8_length("h\xC3\xA9\xF0\x9F\x98\x80"), 3u);
}

}  // namespace
}  // namespace osprey::tokenizer
