// Token ids: signed 32-bit, as in the model's embedding rows and the engine's step inputs.
#pragma once

#include <cstdint>

namespace osprey::tokenizer {
using TokenId = int32_t;
}  // namespace osprey::tokenizer
