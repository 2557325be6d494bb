#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace osprey::tokenizer {
namespace {

// Unicode White_Space (the set Rust's and Oniguruma's Unicode \s use), as class contents.
constexpr std::string_view kWhiteSpaceSet =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// Sizes of the JIT stack each matcher gets: start small, grow for long pieces (a long run of
// whitespace or letters), fail with a clear error past the limit.
constexpr size_t kJitStackStartBytes = 32 * 1024;
constexpr size_t kJitStackMaxBytes = 8 * 1024 * 1024;

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string rewrite_whitespace_classes(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceSet;
        } else {
          out += '[';
          out += kWhiteSpaceSet;
          out += ']';
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceSet;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern, Syntax syntax) : pattern_(pattern), code_(new Code) {
  uint32_t options = PCRE2_UTF | PCRE2_NO_UTF_CHECK;
  std::string compiled;
  if (syntax == Syntax::kLiteral) {
    options |= PCRE2_LITERAL;  // (PCRE2_UCP is not allowed with it, and not needed)
    compiled = pattern_;
  } else {
    options |= PCRE2_UCP;
    compiled = rewrite_whitespace_classes(pattern_);
  }
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                              options, &error, &offset, nullptr);
  if (code_->code == nullptr) {
    fail("invalid regular expression '", pattern_, "' in tokenizer.json: ", pcre2_message(error),
         " (at offset ", offset, ")");
  }
  code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;

struct Regex::Matcher::State {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ~State() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
};

Regex::Matcher::Matcher(const Regex& regex) : regex_(regex), state_(new State) {
  state_->match_data = pcre2_match_data_create_from_pattern(regex_.code_->code, nullptr);
  state_->context = pcre2_match_context_create(nullptr);
  OSPREY_CHECK(state_->match_data && state_->context, "out of memory creating PCRE2 match data");
  if (regex_.code_->jit) {
    state_->jit_stack = pcre2_jit_stack_create(kJitStackStartBytes, kJitStackMaxBytes, nullptr);
    OSPREY_CHECK(state_->jit_stack, "out of memory creating the PCRE2 JIT stack");
    pcre2_jit_stack_assign(state_->context, nullptr, state_->jit_stack);
  }
}

Regex::Matcher::~Matcher() = default;

bool Regex::Matcher::find(std::string_view subject, size_t start, size_t& begin, size_t& end) {
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  while (start < subject.size()) {
    const int rc = regex_.code_->jit
                       ? pcre2_jit_match(regex_.code_->code, data, subject.size(), start, 0,
                                         state_->match_data, state_->context)
                       : pcre2_match(regex_.code_->code, data, subject.size(), start,
                                     PCRE2_NO_UTF_CHECK, state_->match_data, state_->context);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      fail("matching the tokenizer regular expression '", regex_.pattern_,
           "' failed: ", pcre2_message(rc), " (input piece of ", subject.size(), " bytes)");
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state_->match_data);
    begin = ovector[0];
    end = ovector[1];
    if (end > begin) return true;
    // An empty match: skip one character and search again (as find_iter does).
    start = begin + utf8_sequence_length(static_cast<unsigned char>(subject[begin]));
  }
  return false;
}

}  // namespace osprey::tokenizer
