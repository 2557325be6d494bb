#include "eval/boxes_task.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/error.h"

namespace osprey::eval {
namespace {

constexpr uint64_t kTrainSeedLimit = 900'000'000;  // training seeds: [0, this)
constexpr uint64_t kDevBase = 900'000'000, kTestBase = 1'000'000'000;
constexpr uint64_t kShortOffset = 50'000'000;  // the short length's seeds, into its split
constexpr std::string_view kIntro = "Every box below holds some items.";
constexpr std::string_view kKinds[] = {"sum2", "diff", "sum3", "sum2_diff"};
constexpr int kMaxTries = 10'000;  // draws before a question is given up (as generate.py)

std::string fact_text(int box, int count) {
  return "Box " + std::to_string(box) + " holds " + std::to_string(count) + " items.";
}

std::string question_text(std::string_view kind, const std::vector<int>& b) {
  auto box = [&](size_t i) { return "box " + std::to_string(b[i]); };
  if (kind == "sum2") return "How many items do " + box(0) + " and " + box(1) + " hold together?";
  if (kind == "diff") return "How many more items does " + box(0) + " hold than " + box(1) + "?";
  if (kind == "sum3")
    return "How many items do " + box(0) + ", " + box(1) + " and " + box(2) + " hold together?";
  return "How many more items do " + box(0) + " and " + box(1) + " hold together than " + box(2) +
         "?";
}

std::string equation(int64_t a, char op, int64_t b, int64_t c) {
  return std::to_string(a) + " " + op + " " + std::to_string(b) + " = " + std::to_string(c) + ".";
}

}  // namespace

uint64_t SplitMix64::next() {
  state_ += 0x9E3779B97F4A7C15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

BoxesRange boxes_fact_range(BoxesLength length) {
  return length == BoxesLength::Full ? BoxesRange{156, 415} : BoxesRange{130, 135};
}

BoxesProblem make_boxes_problem(uint64_t seed, std::string id, BoxesRange range) {
  SplitMix64 rng(seed);
  const int n = int(rng.between(range.min_facts, range.max_facts));
  OSPREY_CHECK(n - kRecentFacts >= 3, "too few facts before the recent window: ", n);
  // n distinct ids: a partial Fisher-Yates shuffle of kBoxMin..kBoxMax.
  std::vector<int> pool(kBoxMax - kBoxMin + 1);
  std::iota(pool.begin(), pool.end(), kBoxMin);
  for (int i = 0; i < n; ++i) {
    const int j = i + int(rng.below(uint64_t(pool.size()) - uint64_t(i)));
    std::swap(pool[size_t(i)], pool[size_t(j)]);
  }
  const std::vector<int> boxes(pool.begin(), pool.begin() + n);
  std::vector<int> counts(static_cast<size_t>(n));
  for (int& c : counts) c = int(rng.between(kCountMin, kCountMax));

  // The question: distinct facts among the first n - kRecentFacts (diff: the first holds more;
  // sum2_diff: the third holds least, so the answer is positive).
  const std::string kind(kKinds[rng.below(std::size(kKinds))]);
  const size_t k = kind == "sum3" || kind == "sum2_diff" ? 3 : 2;
  const uint64_t eligible = uint64_t(n - kRecentFacts);
  std::vector<int> picked;
  for (int tries = 1; picked.size() < k; ++tries) {
    OSPREY_CHECK(tries <= kMaxTries, "seed ", seed, ": no ", kind, " question among ", eligible,
                 " facts");
    const int i = int(rng.below(eligible));
    if (std::find(picked.begin(), picked.end(), i) != picked.end()) continue;
    if (kind == "diff" && !picked.empty() && counts[size_t(i)] == counts[size_t(picked[0])])
      continue;
    picked.push_back(i);
  }
  if (kind == "diff" && counts[size_t(picked[0])] < counts[size_t(picked[1])])
    std::swap(picked[0], picked[1]);
  if (kind == "sum2_diff") {
    size_t low = 0;  // the smallest count, the first such on ties
    for (size_t j = 1; j < 3; ++j)
      if (counts[size_t(picked[j])] < counts[size_t(picked[low])]) low = j;
    const int last = picked[low];
    picked.erase(picked.begin() + int64_t(low));
    picked.push_back(last);
  }

  std::vector<int> qb, qc;
  for (int i : picked) {
    qb.push_back(boxes[size_t(i)]);
    qc.push_back(counts[size_t(i)]);
  }
  std::string text(kIntro);
  for (int i = 0; i < n; ++i) {
    text += '\n';
    text += fact_text(boxes[size_t(i)], counts[size_t(i)]);
  }
  text += '\n';
  text += question_text(kind, qb);

  std::string solution;
  for (size_t i = 0; i < qb.size(); ++i) solution += fact_text(qb[i], qc[i]) + " ";
  const int64_t a = qc[0], b = qc[1];
  int64_t answer = 0;
  if (kind == "sum2") {
    answer = a + b;
    solution += equation(a, '+', b, answer);
  } else if (kind == "diff") {
    answer = a - b;
    solution += equation(a, '-', b, answer);
  } else {
    const int64_t c = qc[2];
    answer = kind == "sum3" ? a + b + c : a + b - c;
    solution +=
        equation(a, '+', b, a + b) + " " + equation(a + b, kind == "sum3" ? '+' : '-', c, answer);
  }
  solution += " The answer is " + std::to_string(answer) + ".";

  BoxesProblem p;
  p.problem = {std::move(id), std::move(text), std::move(solution), answer};
  p.kind = kind;
  p.n_facts = n;
  p.fact_index = std::move(picked);
  return p;
}

std::vector<BoxesProblem> boxes_problems(std::string_view split, BoxesLength length, int64_t n,
                                         int64_t start) {
  uint64_t base = 0;
  if (split == "dev")
    base = kDevBase;
  else if (split == "test")
    base = kTestBase;
  else
    fail("box problems come in splits dev and test, not '", split, "'");
  static_assert(kDevBase >= kTrainSeedLimit, "held-out seeds overlap the training seeds");
  if (n < 0 || start < 0) fail("box problems: n and start must not be negative");
  const bool full = length == BoxesLength::Full;
  if (!full) base += kShortOffset;
  const std::string tag = std::string(split) + (full ? "" : "-short");
  std::vector<BoxesProblem> out;
  out.reserve(size_t(n));
  for (int64_t i = start; i < start + n; ++i)
    out.push_back(make_boxes_problem(base + uint64_t(i), tag + "-" + std::to_string(i),
                                     boxes_fact_range(length)));
  return out;
}

bool parse_boxes_task(std::string_view task, BoxesLength* length) {
  if (task == "boxes") {
    *length = BoxesLength::Full;
    return true;
  }
  if (task == "boxes-short") {
    *length = BoxesLength::Short;
    return true;
  }
  return false;
}

void write_boxes_problems(const std::vector<BoxesProblem>& ps, const std::string& path) {
  std::ofstream f(path);
  if (!f) fail("cannot write the problem set '", path, "'");
  for (const BoxesProblem& p : ps) {
    const nlohmann::ordered_json j = {{"id", p.problem.id},
                                      {"question", p.problem.question},
                                      {"solution", p.problem.solution},
                                      {"answer", p.problem.answer},
                                      {"kind", p.kind},
                                      {"n_facts", p.n_facts},
                                      {"fact_index", p.fact_index}};
    f << j.dump() << "\n";
  }
  if (!f) fail("writing the problem set '", path, "' failed");
}

}  // namespace osprey::eval
