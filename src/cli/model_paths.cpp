#include "cli/model_paths.h"

#include <cstdlib>

namespace osprey::cli {

std::string resolve_model_dir(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("OSPREY_MODEL"); env && *env) return env;
  return OSPREY_DEFAULT_MODEL_DIR;
}

}  // namespace osprey::cli
