// osprey: serves DeepSeek-V3-family models. `osprey --help` lists the commands.
#include <cstdio>

#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "version_info.h"

namespace osprey::cli {
std::vector<RegisterFn>& command_registry() {
  static std::vector<RegisterFn> registry;
  return registry;
}
}  // namespace osprey::cli

namespace {
// What `osprey --version` prints: version, commit, and whether the CUDA backend is built in.
std::string version_text() {
#ifdef OSPREY_WITH_CUDA
  const char* cuda = "CUDA backend: built in (sm_90a)";
#else
  const char* cuda = "CUDA backend: not built (CPU only)";
#endif
  return std::string("osprey ") + OSPREY_VERSION + " (commit " + OSPREY_GIT_COMMIT + ")\n" + cuda;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"osprey: a C++/CUDA engine for DeepSeek-V3-family models"};
  app.set_version_flag("--version", version_text(), "print the version, commit and backends");
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
