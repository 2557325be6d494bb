#include "eval/answer_extract.h"

#include <cctype>

namespace osprey::eval {
namespace {

bool in_number_class(char c) {  // [$0-9.,]
  return c == '$' || c == '.' || c == ',' || (c >= '0' && c <= '9');
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// Length of the match of  -?[$0-9.,]{2,}|-?[0-9]+  starting exactly at s[i] (0: none), trying
// the alternatives in order with greedy quantifiers, as Python's re does.
size_t match_at(std::string_view s, size_t i) {
  auto run = [&](size_t from, bool (*cls)(char)) {
    size_t j = from;
    while (j < s.size() && cls(s[j])) ++j;
    return j - from;
  };
  const bool minus = s[i] == '-';
  // Alternative 1: -?[$0-9.,]{2,} (with the '-' if there is one, else without; '-' itself is
  // not in the class, so dropping it cannot help).
  size_t n = run(i + (minus ? 1 : 0), in_number_class);
  if (n >= 2) return n + (minus ? 1 : 0);
  // Alternative 2: -?[0-9]+
  n = run(i + (minus ? 1 : 0), is_digit);
  if (n >= 1) return n + (minus ? 1 : 0);
  return 0;
}

}  // namespace

std::string flexible_extract(std::string_view output) {
  std::string_view last;
  for (size_t i = 0; i < output.size();) {
    const size_t n = match_at(output, i);
    if (n == 0) {
      ++i;
      continue;
    }
    last = output.substr(i, n);
    i += n;
  }
  return last.empty() ? std::string(kInvalidAnswer) : std::string(last);
}

std::string normalize_answer(std::string_view answer) {
  std::string s;
  for (char c : answer)
    if (c != ',' && c != '$') s += c;
  // (?s).*#### : greedy, so everything up to and including the last "#### ".
  const size_t hash = s.rfind("#### ");
  if (hash != std::string::npos) s.erase(0, hash + 5);
  if (!s.empty() && s.back() == '.') s.pop_back();
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool answer_matches(std::string_view extracted, std::string_view expected) {
  return normalize_answer(extracted) == normalize_answer(expected);
}

}  // namespace osprey::eval
