// osprey: serves DeepSeek-V3-family models. `osprey --help` lists the commands.
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"

namespace osprey::cli {
std::vector<RegisterFn>& command_registry() {
  static std::vector<RegisterFn> registry;
  return registry;
}
}  // namespace osprey::cli

int main(int argc, char** argv) {
  CLI::App app{"osprey: a C++/CUDA engine for DeepSeek-V3-family models"};
  app.require_subcommand(1);
  for (auto fn : osprey::cli::command_registry()) fn(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const osprey::Error& e) {
    std::fprintf(stderr, "osprey: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
