#include "bench/random_dataset.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace osprey::bench {
namespace {

using tokenizer::TokenId;

constexpr size_t kRedrawOnStall = 4;  // tokens redrawn at the end when a round changes nothing

void validate(const RandomDatasetOptions& o) {
  if (o.num_prompts < 1) fail("--num-prompts must be >= 1, got ", o.num_prompts);
  if (o.input_len < 1) fail("--input-len must be >= 1, got ", o.input_len);
  if (o.output_len < 1) fail("--output-len must be >= 1, got ", o.output_len);
  if (!(o.range_ratio >= 0 && o.range_ratio < 1))
    fail("--range-ratio must be in [0, 1), got ", o.range_ratio);
}

// Uniform integer in [len·(1−r), len·(1+r)] (floor / ceil), at least 1.
int draw_len(std::mt19937_64& rng, int len, double r) {
  const int lo = std::max(1, static_cast<int>(std::floor(len * (1 - r))));
  const int hi = std::max(lo, static_cast<int>(std::ceil(len * (1 + r))));
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

// Per-request lengths from the run's seed, then a per-prompt seed for its tokens.
std::vector<DatasetPrompt> plan_lengths(const RandomDatasetOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::vector<DatasetPrompt> prompts(static_cast<size_t>(o.num_prompts));
  for (auto& p : prompts) p.prompt_len = draw_len(rng, o.input_len, o.range_ratio);
  for (auto& p : prompts) p.output_len = draw_len(rng, o.output_len, o.range_ratio);
  return prompts;
}

uint64_t prompt_seed(uint64_t seed, size_t i) {
  // splitmix64 of (seed, i): independent streams per prompt whatever the thread count.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void build_exact(const tokenizer::Tokenizer& tok, const std::vector<TokenId>& candidates,
                 int max_rounds, uint64_t seed, DatasetPrompt& p) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
  const size_t target = static_cast<size_t>(p.prompt_len);
  std::vector<TokenId> ids;
  ids.reserve(target);
  for (size_t i = 0; i < target; ++i) ids.push_back(candidates[pick(rng)]);
  std::vector<TokenId> encoded, previous;
  for (p.rounds = 1;; ++p.rounds) {
    p.text = tok.decode(ids);
    encoded.clear();
    tok.encode_into(p.text, encoded);
    p.encoded_len = static_cast<int>(encoded.size());
    if (encoded.size() == target || p.rounds >= max_rounds) return;
    previous.swap(ids);
    ids = encoded;
    if (ids.size() > target) {
      ids.resize(target);
    } else {
      while (ids.size() < target) ids.push_back(candidates[pick(rng)]);
    }
    // No progress (the cut re-encodes the same way again): redraw the last few tokens.
    if (ids == previous)
      for (size_t k = 0; k < std::min<size_t>(kRedrawOnStall, target); ++k)
        ids[target - 1 - k] = candidates[pick(rng)];
  }
}

}  // namespace

std::vector<TokenId> sampling_candidates(const tokenizer::Tokenizer& tok) {
  std::vector<TokenId> candidates;
  std::vector<TokenId> one(1), encoded;
  for (TokenId id = 0; id < tok.id_limit(); ++id) {
    if (!tok.is_known(id) || tok.is_special(id) || tok.added_vocabulary().find(id) != nullptr)
      continue;
    one[0] = id;
    const std::string text = tok.decode(one);
    encoded.clear();
    tok.encode_into(text, encoded);  // valid UTF-8 on its own and round-trips: a whole token
    if (encoded.size() == 1 && encoded[0] == id) candidates.push_back(id);
  }
  if (candidates.empty()) fail("the tokenizer has no ordinary tokens that round-trip to sample");
  return candidates;
}

std::vector<DatasetPrompt> random_prompts(const tokenizer::Tokenizer& tok,
                                          const RandomDatasetOptions& o) {
  validate(o);
  const std::vector<TokenId> candidates = sampling_candidates(tok);

  std::vector<DatasetPrompt> prompts = plan_lengths(o);
  const size_t n_threads = std::clamp<size_t>(
      o.threads > 0 ? size_t(o.threads) : size_t(std::max(1u, std::thread::hardware_concurrency())),
      1, prompts.size());
  std::vector<std::thread> workers;
  std::vector<std::exception_ptr> errors(n_threads);
  for (size_t w = 0; w < n_threads; ++w)
    workers.emplace_back([&, w] {
      try {
        for (size_t i = w; i < prompts.size(); i += n_threads)
          build_exact(tok, candidates, o.max_rounds, prompt_seed(o.seed, i), prompts[i]);
      } catch (...) {
        errors[w] = std::current_exception();
      }
    });
  for (auto& t : workers) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return prompts;
}

std::vector<DatasetPrompt> random_prompts_approximate(const RandomDatasetOptions& o) {
  validate(o);
  static constexpr const char* kWords[] = {
      "the",   "of",    "and",    "to",     "in",      "is",   "that",  "for",   "it",     "as",
      "was",   "with",  "be",     "by",     "on",      "not",  "he",    "this",  "are",    "or",
      "his",   "from",  "at",     "which",  "but",     "have", "an",    "had",   "they",   "you",
      "were",  "their", "one",    "all",    "we",      "can",  "her",   "has",   "there",  "been",
      "if",    "more",  "when",   "will",   "would",   "who",  "so",    "no",    "time",   "out",
      "up",    "about", "into",   "than",   "its",     "only", "other", "new",   "some",   "could",
      "these", "two",   "may",    "first",  "then",    "do",   "any",   "like",  "my",     "now",
      "over",  "such",  "our",    "man",    "me",      "even", "most",  "made",  "after",  "also",
      "did",   "many",  "before", "must",   "through", "back", "years", "where", "much",   "your",
      "way",   "well",  "down",   "should", "because", "each", "just",  "those", "people", "how"};
  std::vector<DatasetPrompt> prompts = plan_lengths(o);
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::mt19937_64 rng(prompt_seed(o.seed, i));
    std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
    DatasetPrompt& p = prompts[i];
    for (int w = 0; w < p.prompt_len; ++w) {
      if (w) p.text.push_back(' ');
      p.text += kWords[pick(rng)];
    }
    p.encoded_len = p.prompt_len;
    p.rounds = 0;
  }
  return prompts;
}

}  // namespace osprey::bench
