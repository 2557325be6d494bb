// JSON text as Python's json.dumps(value, ensure_ascii=False) writes it: ", " and ": " separators,
// keys in the order given, non-ASCII characters as they are, floats as Python's repr. DeepSeek
// V3.2's encoding script renders tool schemas and non-string tool arguments this way, so a prompt
// built here is byte for byte the script's.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace osprey::tokenizer {

std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace osprey::tokenizer
