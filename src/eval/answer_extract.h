// Answer extraction as lm-evaluation-harness's GSM8K "flexible-extract" filter and its exact_match
// metric (gsm8k.yaml): the last match of  -?[$0-9.,]{2,}|-?[0-9]+  in the output ("[invalid]"
// when there is none), then, on both the extracted and the expected answer, the metric's
// regexes_to_ignore in order: "," and "$" removed, everything up to a last "#### " removed, one
// trailing "." removed; then compared exactly (ignore_case).
//   "... 37 - 12 = 25. The answer is 25."  → "25"        "It costs $1,200."  → "1200"
#pragma once

#include <string>
#include <string_view>

namespace osprey::eval {

inline constexpr std::string_view kInvalidAnswer = "[invalid]";

// The filter: the last number-like match in `output`, or kInvalidAnswer.
std::string flexible_extract(std::string_view output);
// The metric's normalisation (regexes_to_ignore + ignore_case).
std::string normalize_answer(std::string_view answer);
// exact_match of the extracted answer against the expected one, both normalised.
bool answer_matches(std::string_view extracted, std::string_view expected);

}  // namespace osprey::eval
