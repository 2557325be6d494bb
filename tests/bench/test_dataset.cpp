// The random dataset: prompts whose text encodes to exactly the asked number of tokens, with a
// small byte-level BPE tokenizer whose merges make decode → encode change lengths.
#include "test_dataset.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "bench/random_dataset.h"
#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace osprey::bench::testing {

std::string tiny_tokenizer_json() {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b)
    vocab[tokenizer::bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  // Merges that random ASCII runs often complete: the re-encoding then has fewer tokens.
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {"th", "e"}, {" ", "t"},  {" t", "h"}, {" th", "e"}, {"e", "r"}, {"a", "n"},
      {"i", "n"}, {"o", "n"},  {"e", "s"},  {" ", "a"},  {"r", "e"},   {"a", "t"}, {"e", "n"},
      {"o", "r"}, {"1", "2"},  {"12", "3"}, {",", " "},  {".", " "}};
  json merge_list = json::array();
  int next = 256;
  for (const auto& [l, r] : merges) {
    const std::string bl = tokenizer::bytes_to_byte_level(l),
                      br = tokenizer::bytes_to_byte_level(r);
    if (!vocab.contains(bl + br)) vocab[bl + br] = next++;
    merge_list.push_back(bl + " " + br);
  }
  json added = json::array({{{"id", next},
                             {"content", "<|endoftext|>"},
                             {"special", true},
                             {"lstrip", false},
                             {"rstrip", false},
                             {"single_word", false},
                             {"normalized", false}}});
  const json j = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"vocab", vocab},
        {"merges", merge_list}}},
  };
  return j.dump();
}

std::string write_tiny_tokenizer() {
  const auto dir = std::filesystem::temp_directory_path() / "osprey_bench_tok";
  std::filesystem::create_directories(dir);
  const auto path = dir / "tokenizer.json";
  std::ofstream(path) << tiny_tokenizer_json();
  return path.string();
}

namespace {

TEST(RandomDataset, PromptsEncodeToExactlyTheTargetLength) {
  const auto tok = tokenizer::Tokenizer::from_json(tiny_tokenizer_json());
  RandomDatasetOptions o;
  o.num_prompts = 60;
  o.input_len = 200;
  o.output_len = 30;
  o.range_ratio = 0.5;
  o.seed = 11;
  const std::vector<DatasetPrompt> ps = random_prompts(tok, o);
  ASSERT_EQ(ps.size(), 60u);
  int adjusted = 0, min_in = 1 << 30, max_in = 0;
  std::set<int> outs;
  const int special = *tok.token_to_id("<|endoftext|>");
  for (const DatasetPrompt& p : ps) {
    const auto ids = tok.encode(p.text);
    EXPECT_EQ(int(ids.size()), p.prompt_len);  // exact
    EXPECT_EQ(p.encoded_len, p.prompt_len);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), special), 0);
    EXPECT_GE(p.prompt_len, 100);
    EXPECT_LE(p.prompt_len, 300);
    EXPECT_GE(p.output_len, 15);
    EXPECT_LE(p.output_len, 45);
    adjusted += p.rounds > 1;
    min_in = std::min(min_in, p.prompt_len);
    max_in = std::max(max_in, p.prompt_len);
    outs.insert(p.output_len);
  }
  // For some prompts the first decode → encode round merged tokens: the adjusting loop ran.
  EXPECT_GE(adjusted, 5);
  EXPECT_LT(min_in, 140);  // lengths really spread over the range
  EXPECT_GT(max_in, 260);
  EXPECT_GT(outs.size(), 5u);
  // Deterministic for a seed, whatever the thread count.
  o.threads = 1;
  const std::vector<DatasetPrompt> again = random_prompts(tok, o);
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(ps[i].text, again[i].text);
}

TEST(RandomDataset, FixedLengthWithoutRangeAndCandidatesExcludeSpecialAndFragments) {
  const auto tok = tokenizer::Tokenizer::from_json(tiny_tokenizer_json());
  const std::vector<int32_t> c = sampling_candidates(tok);
  const int special = *tok.token_to_id("<|endoftext|>");
  EXPECT_EQ(std::count(c.begin(), c.end(), special), 0);
  EXPECT_EQ(std::count(c.begin(), c.end(), 0xC3), 0);  // a lone UTF-8 lead byte
  EXPECT_EQ(std::count(c.begin(), c.end(), int('a')), 1);
  RandomDatasetOptions o;
  o.num_prompts = 5;
  o.input_len = 37;
  o.output_len = 9;
  for (const DatasetPrompt& p : random_prompts(tok, o)) {
    EXPECT_EQ(p.prompt_len, 37);
    EXPECT_EQ(p.output_len, 9);
    EXPECT_EQ(tok.encode(p.text).size(), 37u);
  }
  o.range_ratio = 1.0;
  EXPECT_THROW(random_prompts(tok, o), Error);
  o.range_ratio = 0;
  o.input_len = 0;
  EXPECT_THROW(random_prompts(tok, o), Error);
}

// The real vocabulary, when the tokenizer tests' npm fixture has fetched it (or
// OSPREY_DEEPSEEK_TOKENIZER names a tokenizer.json).
TEST(RandomDataset, DeepSeekV3TokenizerExact) {
  const char* env = std::getenv("OSPREY_DEEPSEEK_TOKENIZER");
  const std::string path = env ? env : OSPREY_DEEPSEEK_TOKENIZER;
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no DeepSeek tokenizer at " << path;
  const auto tok = tokenizer::Tokenizer::load(path);
  RandomDatasetOptions o;
  o.num_prompts = 16;
  o.input_len = 5000;
  o.output_len = 500;
  for (const DatasetPrompt& p : random_prompts(tok, o)) {
    EXPECT_EQ(p.encoded_len, 5000);
    EXPECT_EQ(tok.encode(p.text).size(), 5000u);
  }
}

}  // namespace
}  // namespace osprey::bench::testing
