// BPE merging on tiny vocabularies whose ids are known: byte b has id b, merges add 256, 257, ...
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace osprey::tokenizer {
namespace {

using testing::tiny_tokenizer;
using testing::TinySpec;
using Ids = std::vector<TokenId>;

// Whole input as one piece: no regex split, so merges alone decide.
TinySpec whole_word(std::vector<std::pair<std::string, std::string>> merges) {
  TinySpec spec;
  spec.merges = std::move(merges);
  spec.pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  return spec;
}

Tokenizer make(const TinySpec& spec) {
  return Tokenizer::from_json(tiny_tokenizer(spec).dump());
}

TEST(Bpe, LowestRankMergesFirst) {
  // bc = 256 (rank 0), ab = 257 (rank 1): "abc" -> a + bc.
  EXPECT_EQ(make(whole_word({{"b", "c"}, {"a", "b"}})).encode("abc"), (Ids{'a', 256}));
  // ab = 256 (rank 0), bc = 257 (rank 1): "abc" -> ab + c.
  EXPECT_EQ(make(whole_word({{"a", "b"}, {"b", "c"}})).encode("abc"), (Ids{256, 'c'}));
}

TEST(Bpe, LeftmostPairWinsATie) {
  EXPECT_EQ(make(whole_word({{"a", "a"}})).encode("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(make(whole_word({{"a", "a"}, {"aa", "aa"}})).encode("aaaaa"), (Ids{257, 'a'}));
}

TEST(Bpe, MergesAsPairsEqualMergesAsStrings) {
  TinySpec spec = whole_word({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}});
  const Ids as_strings = make(spec).encode("hello hell");
  spec.merges_as_pairs = true;
  EXPECT_EQ(make(spec).encode("hello hell"), as_strings);
  EXPECT_EQ(as_strings[0], 259);  // "hello" whole
}

TEST(Bpe, RepeatedMergeTakesTheLaterRank) {
  // ("a","b") appears at ranks 0 and 2; rank 2 holds, so ("b","c") at rank 1 goes first.
  EXPECT_EQ(make(whole_word({{"a", "b"}, {"b", "c"}, {"a", "b"}})).encode("abc"), (Ids{'a', 257}));
}

TEST(Bpe, IgnoreMergesTakesWholeWordsFromTheVocab) {
  TinySpec spec = whole_word({{"a", "b"}, {"b", "c"}, {"a", "bc"}});  // ab 256, bc 257, abc 258
  EXPECT_EQ(make(spec).encode("abc"), (Ids{256, 'c'}));
  spec.ignore_merges = true;
  EXPECT_EQ(make(spec).encode("abc"), (Ids{258}));
}

// An independent, slow statement of the rule: merge the lowest-rank adjacent pair, leftmost first.
Ids naive_bpe(const std::string& word,
              const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<std::string> symbols;
  for (char c : word) symbols.emplace_back(1, c);
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t r = 0; r < merges.size(); ++r) rank[merges[r]] = r;
  for (;;) {
    size_t best = SIZE_MAX, at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = rank.find({symbols[i], symbols[i + 1]});
      if (it != rank.end() && it->second < best) best = it->second, at = i;
    }
    if (best == SIZE_MAX) break;
    symbols[at] += symbols[at + 1];
    symbols.erase(symbols.begin() + static_cast<long>(at) + 1);
  }
  std::map<std::string, TokenId> id;
  TokenId next = 256;
  for (const auto& [l, r] : merges) {
    if (!id.count(l + r)) id[l + r] = next++;
  }
  Ids out;
  for (const auto& s : symbols)
    out.push_back(s.size() == 1 ? static_cast<unsigned char>(s[0]) : id[s]);
  return out;
}

TEST(Bpe, LongWordsAgreeWithTheNaiveRule) {
  // Words longer than the linear-scan limit take the heap path; both must follow the rule.
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"a", "b"},  {"b", "c"},  {"c", "a"}, {"ab", "c"},  {"a", "a"}, {"abc", "abc"},
      {"bc", "a"}, {"aa", "b"}, {"c", "c"}, {"cc", "cc"}, {"b", "b"}, {"bca", "bca"}};
  const Tokenizer tok = make(whole_word(merges));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t len = 1 + rng() % 400;
    std::string word;
    for (size_t i = 0; i < len; ++i) word.push_back("abc"[rng() % 3]);
    ASSERT_EQ(tok.encode(word), naive_bpe(word, merges)) << word;
  }
}

}  // namespace
}  // namespace osprey::tokenizer
