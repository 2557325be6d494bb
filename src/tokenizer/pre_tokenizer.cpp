#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace osprey::tokenizer {
namespace {

using nlohmann::json;

SplitBehavior parse_behavior(const std::string& name) {
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  fail("Split pre-tokenizer: unknown behavior '", name,
       "' (expected Isolated, Removed, MergedWithPrevious, MergedWithNext or Contiguous)");
}

}  // namespace

PreTokenizer::PreTokenizer(const json& config) {
  if (!config.is_null()) add_steps(config);
  if (!has_byte_level_) {
    fail(
        "the tokenizer has no ByteLevel pre-tokenizer: osprey loads byte-level BPE tokenizers "
        "(GPT-2, Llama 3, DeepSeek-V3, Qwen style)");
  }
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::add_split(std::unique_ptr<Regex> regex, SplitBehavior behavior, bool invert) {
  Step step{Step::Kind::kSplit, regexes_.size(), behavior, invert};
  regexes_.push_back(std::move(regex));
  steps_.push_back(step);
}

void PreTokenizer::add_steps(const json& config) {
  const std::string type = config.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const auto& step : config.at("pretokenizers")) add_steps(step);
    return;
  }
  if (type == "Split") {
    const json& pattern = config.at("pattern");
    std::unique_ptr<Regex> regex;
    if (pattern.contains("Regex")) {
      regex = std::make_unique<Regex>(pattern.at("Regex").get<std::string>());
    } else if (pattern.contains("String")) {
      regex =
          std::make_unique<Regex>(pattern.at("String").get<std::string>(), Regex::Syntax::kLiteral);
    } else {
      fail("Split pre-tokenizer: pattern must have a \"Regex\" or \"String\" field");
    }
    add_split(std::move(regex), parse_behavior(config.at("behavior").get<std::string>()),
              config.value("invert", false));
    return;
  }
  if (type == "ByteLevel") {
    if (has_byte_level_) fail("the pre_tokenizer has more than one ByteLevel step");
    has_byte_level_ = true;
    if (config.value("add_prefix_space", false)) steps_.push_back({Step::Kind::kPrefixSpace});
    if (config.value("use_regex", true)) {
      add_split(std::make_unique<Regex>(kGpt2Pattern), SplitBehavior::kIsolated, false);
    }
    return;
  }
  fail("pre_tokenizer type '", type,
       "' is not supported (osprey supports Sequence, Split and ByteLevel, the pre-tokenizers of "
       "byte-level BPE tokenizers)");
}

std::unique_ptr<PreTokenizer::Scratch> PreTokenizer::make_scratch() const {
  auto scratch = std::make_unique<Scratch>();
  for (const auto& regex : regexes_) {
    scratch->matchers.push_back(std::make_unique<Regex::Matcher>(*regex));
  }
  return scratch;
}

void PreTokenizer::split(std::string_view text, Scratch& scratch,
                         std::vector<std::string_view>& pieces) const {
  pieces.clear();
  scratch.arena.clear();
  if (text.empty()) return;
  pieces.push_back(text);
  for (const Step& step : steps_) {
    if (step.kind == Step::Kind::kPrefixSpace) {
      for (auto& piece : pieces) {
        if (piece.front() == ' ') continue;
        std::string& spaced = scratch.arena.emplace_back();
        spaced.reserve(piece.size() + 1);
        spaced.push_back(' ');
        spaced.append(piece);
        piece = spaced;
      }
    } else {
      apply_split(step, scratch, pieces);
    }
  }
}

void PreTokenizer::apply_split(const Step& step, Scratch& scratch,
                               std::vector<std::string_view>& pieces) const {
  Regex::Matcher& matcher = *scratch.matchers[step.regex];
  auto& out = scratch.next;
  auto& segments = scratch.segments;
  out.clear();
  for (std::string_view piece : pieces) {
    // The piece as alternating gaps and matches (is_match flipped when inverted).
    segments.clear();
    size_t pos = 0, begin, end;
    while (matcher.find(piece, pos, begin, end)) {
      if (begin > pos) segments.push_back({pos, begin, step.invert});
      segments.push_back({begin, end, !step.invert});
      pos = end;
    }
    if (pos < piece.size()) segments.push_back({pos, piece.size(), step.invert});

    // Pieces of this input piece start at out[first].
    const size_t first = out.size();
    auto view = [&](size_t b, size_t e) { return piece.substr(b, e - b); };
    auto extend_last = [&](size_t e) {
      const char* start = out.back().data();
      out.back() = std::string_view(start, piece.data() + e - start);
    };
    bool previous_match = false;
    switch (step.behavior) {
      case SplitBehavior::kIsolated:
        for (const auto& s : segments) out.push_back(view(s.begin, s.end));
        break;
      case SplitBehavior::kRemoved:
        for (const auto& s : segments) {
          if (!s.is_match) out.push_back(view(s.begin, s.end));
        }
        break;
      case SplitBehavior::kContiguous:
        for (const auto& s : segments) {
          if (s.is_match == previous_match && out.size() > first) {
            extend_last(s.end);
          } else {
            out.push_back(view(s.begin, s.end));
          }
          previous_match = s.is_match;
        }
        break;
      case SplitBehavior::kMergedWithPrevious:
        for (const auto& s : segments) {
          if (s.is_match && !previous_match && out.size() > first) {
            extend_last(s.end);
          } else {
            out.push_back(view(s.begin, s.end));
          }
          previous_match = s.is_match;
        }
        break;
      case SplitBehavior::kMergedWithNext: {
        // Walk backwards: a match joins the piece that follows it.
        const size_t mark = out.size();
        for (size_t i = segments.size(); i-- > 0;) {
          const auto& s = segments[i];
          if (s.is_match && !previous_match && out.size() > mark) {
            const char* stop = out.back().data() + out.back().size();
            out.back() = std::string_view(piece.data() + s.begin, stop - (piece.data() + s.begin));
          } else {
            out.push_back(view(s.begin, s.end));
          }
          previous_match = s.is_match;
        }
        std::reverse(out.begin() + static_cast<std::ptrdiff_t>(mark), out.end());
        break;
      }
    }
  }
  pieces.swap(out);
}

}  // namespace osprey::tokenizer
