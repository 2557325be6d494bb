// Each `osprey <command>` lives in its own cmd_*.cpp and registers itself on the CLI11 app with
// OSPREY_REGISTER_COMMAND(fn), where fn(CLI::App&) adds the subcommand and its callback.
// Callbacks report user errors by throwing osprey::Error; main prints the message and exits 1.
#pragma once

#include <CLI/CLI.hpp>
#include <vector>

namespace osprey::cli {

using RegisterFn = void (*)(CLI::App&);
std::vector<RegisterFn>& command_registry();

struct CommandRegistrar {
  explicit CommandRegistrar(RegisterFn fn) { command_registry().push_back(fn); }
};

}  // namespace osprey::cli

#define OSPREY_REGISTER_COMMAND(fn) static ::osprey::cli::CommandRegistrar osprey_registrar_##fn(fn)
