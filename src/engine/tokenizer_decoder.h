// The engine's TextDecoder over osprey's tokenizer: each request streams through its own
// IncrementalDetokenizer (special tokens skipped unless the request keeps them, split characters
// held back).
#pragma once

#include "engine/text_decoder.h"
#include "tokenizer/tokenizer.h"

namespace osprey {

// The factory keeps a reference to `tok`, which must outlive the engine.
TextDecoderFactory make_text_decoder_factory(const tokenizer::Tokenizer& tok);

}  // namespace osprey
