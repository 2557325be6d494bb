// Streaming detokenization: token ids in, text deltas out, one call per generated token.
// Every delta is valid UTF-8; the bytes of a character split across tokens are held back until
// the character is complete; invalid bytes become U+FFFD as soon as they are known to be invalid.
// The concatenated deltas plus finish() equal Tokenizer::decode of all the ids.
#pragma once

#include <span>
#include <string>

#include "tokenizer/tokenizer.h"

namespace osprey::tokenizer {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, DecodeOptions options = {});

  // The text that `id` completes (possibly empty). Throws osprey::Error for an unknown id, and
  // then leaves the state as it was.
  std::string step(TokenId id);
  std::string step(std::span<const TokenId> ids);
  // Flushes held-back bytes of an unfinished character (as U+FFFD) and resets.
  std::string finish();
  // Bytes held back, waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  void drain(std::string& out);

  const Tokenizer& tokenizer_;
  DecodeOptions options_;
  std::string pending_;
};

}  // namespace osprey::tokenizer
