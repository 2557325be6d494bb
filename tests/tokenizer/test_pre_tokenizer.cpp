#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/pre_tokenizer.h"

namespace osprey::tokenizer {
namespace {

using nlohmann::json;
using Pieces = std::vector<std::string>;

Pieces split(const json& config, std::string_view text) {
  PreTokenizer pre(config);
  auto scratch = pre.make_scratch();
  std::vector<std::string_view> views;
  pre.split(text, *scratch, views);
  return Pieces(views.begin(), views.end());
}

json split_then_bytes(const std::string& pattern, const std::string& behavior, bool invert,
                      bool literal = false) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{literal ? "String" : "Regex", pattern}}},
             {"behavior", behavior},
             {"invert", invert}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
}

TEST(PreTokenizer, SplitBehaviors) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(split(split_then_bytes("-", "Removed", false, true), text),
            (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(split(split_then_bytes("-", "Isolated", false, true), text),
            (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split(split_then_bytes("-", "MergedWithPrevious", false, true), text),
            (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split(split_then_bytes("-", "MergedWithNext", false, true), text),
            (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split(split_then_bytes("-", "Contiguous", false, true), text),
            (Pieces{"the", "-", "final", "--", "countdown"}));
}

TEST(PreTokenizer, InvertKeepsTheMatches) {
  // Removed + invert: keep what the regex matches, drop the gaps (tiktoken-style configs).
  EXPECT_EQ(split(split_then_bytes("[a-z]+", "Removed", true), "ab, cd!e"),
            (Pieces{"ab", "cd", "e"}));
}

TEST(PreTokenizer, Gpt2PatternWithByteLevelUseRegex) {
  const json gpt2 = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  EXPECT_EQ(split(gpt2, "Hello world's  end 42!"),
            (Pieces{"Hello", " world", "'s", " ", " end", " 42", "!"}));
  const json prefixed = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(split(prefixed, "Hi there"), (Pieces{" Hi", " there"}));
}

TEST(PreTokenizer, DeepSeekDigitsAndCjkPatterns) {
  const json ds = {{"type", "Sequence"},
                   {"pretokenizers",
                    {{{"type", "Split"},
                      {"pattern", {{"Regex", "\\p{N}{1,3}"}}},
                      {"behavior", "Isolated"},
                      {"invert", false}},
                     {{"type", "Split"},
                      {"pattern", {{"Regex", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"}}},
                      {"behavior", "Isolated"},
                      {"invert", false}},
                     {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_EQ(split(ds, "1234567"), (Pieces{"123", "456", "7"}));
  EXPECT_EQ(split(ds, "ab中文cd"), (Pieces{"ab", "中文", "cd"}));
}

TEST(PreTokenizer, WhitespaceClassIsUnicodeWhiteSpace) {
  // \s must cover U+3000 and U+00A0 (Unicode White_Space) but not U+180E.
  EXPECT_EQ(rewrite_whitespace_classes("\\s+[^\\s]"),
            "[\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
            "\\x{202F}\\x{205F}\\x{3000}]+[^\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}"
            "\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]");
  EXPECT_EQ(split(split_then_bytes("\\s+", "Removed", false), "a\u3000b\u180Ec"),
            (Pieces{"a", "b\u180Ec"}));
}

TEST(PreTokenizer, UnsupportedTypesAreNamed) {
  try {
    split({{"type", "Metaspace"}, {"replacement", "▁"}}, "x");
    FAIL() << "Metaspace accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'Metaspace' is not supported"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(split(split_then_bytes("[a-", "Isolated", false), "x"), Error);  // bad regex
  EXPECT_THROW(
      split({{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Isolated"}}, "x"),
      Error);  // no ByteLevel step: not byte-level
}

}  // namespace
}  // namespace osprey::tokenizer
