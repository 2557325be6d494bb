// What the engine needs from a tokenizer to stream text: an incremental decoder per request that
// turns token ids into UTF-8 text deltas (holding back a character split across tokens).
// The tokenizer library provides the implementation; the engine stays independent of it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace osprey {

class TextDecoder {
 public:
  virtual ~TextDecoder() = default;
  virtual std::string push(int32_t token) = 0;  // text completed by this token (may be empty)
  virtual std::string finish() = 0;             // whatever is still held back
};

// The argument: whether special tokens are left out of the text (SamplingParams).
using TextDecoderFactory = std::function<std::unique_ptr<TextDecoder>(bool skip_special_tokens)>;

}  // namespace osprey
