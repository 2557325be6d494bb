// The long-context box task (issue #19): a few hundred "Box K holds N items." facts and one
// question combining two or three of them, answered in the arithmetic task's worked-solution
// style ("Box 417 holds 58 items. Box 203 holds 17 items. 58 + 17 = 75. The answer is 75.") and
// scored like it (eval/arith_task.h: the last number, exact match). The accuracy gate at
// DeepSeek-V3.2's kernel shapes with prompts where the indexer's top-2048 decides what is seen:
//   boxes        prompts of 3,000-8,000 tokens (156-415 facts; the bundled tokenizer spells every
//                fact line in kFactTokens tokens);
//   boxes-short  the CI's reduced length, 2,500-2,650 tokens (130-135 facts), still above 2048.
// Every held-out question asks only about facts before the last kRecentFacts facts of the
// prompt, more than 2,048 tokens before its end: attention over the most recent 2048 positions
// (the --indexer-recent control) cannot see them.
//
// The problems are generated here, not read from a file: problem i of a split comes from
// splitmix64 seeded with its split's base + i alone, drawn exactly as tools/boxes/generate.py
// draws them (that file is the training data's source; ctest boxes_generator_match compares the
// two). The prompt is the question alone as one user turn, as for arith.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "eval/arith_task.h"

namespace osprey::eval {

// splitmix64 (Steele, Lea, Flood 2014): a few integer operations, the same in Python.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  uint64_t below(uint64_t n) { return next() % n; }  // [0, n); bias < n / 2^64
  int64_t between(int64_t lo, int64_t hi) { return lo + int64_t(below(uint64_t(hi - lo + 1))); }

 private:
  uint64_t state_;
};

inline constexpr int kBoxMin = 100, kBoxMax = 999;    // three digits each
inline constexpr int kCountMin = 10, kCountMax = 99;  // two digits each
inline constexpr int kFactTokens = 19;                // per fact line, bundled tokenizer
inline constexpr int kRecentFacts = 120;  // 2,280 tokens + the question: > 2048 + answer + margin
inline constexpr int64_t kBoxesTestSize = 200;  // the gate's held-out problems

enum class BoxesLength { Full, Short };

struct BoxesRange {
  int min_facts, max_facts;
};
BoxesRange boxes_fact_range(BoxesLength length);

// What a problem asks (the solution and answer follow from it).
struct BoxesProblem {
  ArithProblem problem;  // id, question (the whole user message), solution, answer
  std::string kind;      // sum2 | diff | sum3 | sum2_diff
  int n_facts = 0;
  std::vector<int> fact_index;  // the facts asked about, in the question's order
};

// The problem drawn from SplitMix64(seed) with n_facts in `range`, asking only about facts before
// the last kRecentFacts.
BoxesProblem make_boxes_problem(uint64_t seed, std::string id, BoxesRange range);

// Held-out problems start .. start + n - 1 of split "dev" or "test" (osprey::Error otherwise).
std::vector<BoxesProblem> boxes_problems(std::string_view split, BoxesLength length, int64_t n,
                                         int64_t start = 0);

// "boxes" → Full, "boxes-short" → Short; false for any other task name.
bool parse_boxes_task(std::string_view task, BoxesLength* length);

// One JSON line per problem, the fields tools/boxes/generate.py writes
// ({"id", "question", "solution", "answer", "kind", "n_facts", "fact_index"}).
void write_boxes_problems(const std::vector<BoxesProblem>& ps, const std::string& path);

}  // namespace osprey::eval
