// Regular expressions of tokenizer.json through PCRE2 with JIT. The patterns in tokenizer.json are
// written for Hugging Face's Rust library: Unicode classes (\p{L}), look-ahead, (?i:...) groups.
// PCRE2 understands them as they are, with one rewrite: `\s` becomes the Unicode White_Space set
// (PCRE2's \s differs from it on U+180E), so that whitespace splits match the Rust library.
//
// A Regex is immutable and shared; each thread matches through its own Regex::Matcher, which owns
// the PCRE2 match data and JIT stack and is reused across calls (no allocation per match).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace osprey::tokenizer {

class Regex {
 public:
  enum class Syntax { kRegex, kLiteral };

  // Compiles `pattern`; throws osprey::Error with PCRE2's message and offset when it is invalid.
  explicit Regex(std::string_view pattern, Syntax syntax = Syntax::kRegex);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  const std::string& pattern() const { return pattern_; }

  class Matcher {
   public:
    explicit Matcher(const Regex& regex);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;

    // Finds the leftmost non-empty match in `subject` starting at or after byte `start` (subject
    // must be valid UTF-8). Sets [begin, end) and returns true, or returns false when none.
    bool find(std::string_view subject, size_t start, size_t& begin, size_t& end);

   private:
    struct State;
    const Regex& regex_;
    std::unique_ptr<State> state_;
  };

 private:
  struct Code;
  std::string pattern_;
  std::unique_ptr<Code> code_;
};

// Rewrites `\s` in a tokenizer.json pattern to the explicit Unicode White_Space set (exposed for
// tests).
std::string rewrite_whitespace_classes(std::string_view pattern);

}  // namespace osprey::tokenizer
