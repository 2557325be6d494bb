// The `pre_tokenizer` of tokenizer.json, for byte-level BPE: a Sequence of Split steps (regex or
// literal pattern; behaviors Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous;
// invert) and one ByteLevel step (add_prefix_space; use_regex applies the GPT-2 pattern). Other
// pre-tokenizer types stop loading with an error that names them.
//
// Pieces are views into the text being encoded; the only step that writes new text
// (add_prefix_space) keeps it in the per-thread scratch arena.
#pragma once

#include <deque>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace osprey::tokenizer {

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// The pattern GPT-2's ByteLevel pre-tokenizer splits with when use_regex is true.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  // Per-thread state: one matcher per regex, scratch vectors, the arena for rewritten pieces.
  struct Scratch {
    std::vector<std::unique_ptr<Regex::Matcher>> matchers;
    std::vector<std::string_view> next;
    struct Segment {
      size_t begin, end;
      bool is_match;
    };
    std::vector<Segment> segments;
    std::deque<std::string> arena;
  };

  // Reads the `pre_tokenizer` field; throws osprey::Error for unsupported types or a tokenizer
  // that has no ByteLevel step.
  explicit PreTokenizer(const nlohmann::json& config);
  ~PreTokenizer();

  std::unique_ptr<Scratch> make_scratch() const;

  // Splits `text` into `pieces` (cleared first). Views point into `text` or `scratch.arena`.
  void split(std::string_view text, Scratch& scratch, std::vector<std::string_view>& pieces) const;

 private:
  struct Step {
    enum class Kind { kSplit, kPrefixSpace } kind;
    size_t regex = 0;  // index into regexes_ (kSplit)
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
  };
  void add_steps(const nlohmann::json& config);
  void add_split(std::unique_ptr<Regex> regex, SplitBehavior behavior, bool invert);
  void apply_split(const Step& step, Scratch& scratch, std::vector<std::string_view>& pieces) const;

  std::vector<Step> steps_;
  std::vector<std::unique_ptr<Regex>> regexes_;
  bool has_byte_level_ = false;
};

}  // namespace osprey::tokenizer
