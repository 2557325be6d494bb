#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace osprey::tokenizer {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(tokenizer), options_(options) {}

std::string IncrementalDetokenizer::step(TokenId id) {
  std::string out;
  std::string_view bytes = tokenizer_.token_bytes(id);  // throws before any state changes
  if (options_.skip_special_tokens && tokenizer_.is_special(id)) return out;
  pending_.append(bytes);
  drain(out);
  return out;
}

std::string IncrementalDetokenizer::step(std::span<const TokenId> ids) {
  for (TokenId id : ids) tokenizer_.token_bytes(id);  // validate all first
  std::string out;
  for (TokenId id : ids) {
    if (options_.skip_special_tokens && tokenizer_.is_special(id)) continue;
    pending_.append(tokenizer_.token_bytes(id));
    drain(out);
  }
  return out;
}

void IncrementalDetokenizer::drain(std::string& out) {
  size_t i = 0;
  while (i < pending_.size()) {
    const Utf8Step s = utf8_step(std::string_view(pending_).substr(i));
    if (s.status == Utf8Status::kTruncated) break;  // wait for the rest of the character
    if (s.status == Utf8Status::kComplete) {
      out.append(pending_, i, s.length);
    } else {
      out.append(kReplacementCharacter);
    }
    i += s.length;
  }
  pending_.erase(0, i);
}

std::string IncrementalDetokenizer::finish() {
  std::string out;
  if (!pending_.empty()) out.append(kReplacementCharacter);  // an unfinished character
  pending_.clear();
  return out;
}

}  // namespace osprey::tokenizer
