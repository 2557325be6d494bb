// Where the CLI finds models: --model DIR, else $OSPREY_MODEL, else the bundled model in the
// source tree (models/osprey-arith).
#pragma once

#include <string>

namespace osprey::cli {
std::string resolve_model_dir(const std::string& flag);
}
