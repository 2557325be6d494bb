#include <gtest/gtest.h>

#include "tokenizer/byte_level.h"

namespace osprey::tokenizer {
namespace {

TEST(ByteLevel, Gpt2AlphabetFixedPoints) {
  EXPECT_EQ(byte_to_unicode('A'), U'A');
  EXPECT_EQ(byte_to_unicode('~'), U'~');
  EXPECT_EQ(byte_to_unicode(' '), U'\u0120');   // Ġ
  EXPECT_EQ(byte_to_unicode('\n'), U'\u010A');  // Ċ
  EXPECT_EQ(byte_to_unicode(0x00), U'\u0100');
  EXPECT_EQ(byte_to_unicode(0xAD), U'\u0143');  // soft hyphen is not printable: the last one
  EXPECT_EQ(byte_to_unicode(0xE9), U'\u00E9');
}

TEST(ByteLevel, RoundTripsAllBytes) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  bool mapped = false;
  EXPECT_EQ(byte_level_to_bytes(bytes_to_byte_level(all), &mapped), all);
  EXPECT_TRUE(mapped);
  EXPECT_EQ(bytes_to_byte_level(" the"), "\xC4\xA0the");  // "Ġthe"
}

TEST(ByteLevel, TextOutsideTheAlphabetStaysAsItIs) {
  bool mapped = true;
  EXPECT_EQ(byte_level_to_bytes("<｜User｜>", &mapped), "<｜User｜>");
  EXPECT_FALSE(mapped);
}

}  // namespace
}  // namespace osprey::tokenizer
