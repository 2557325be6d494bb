// Flags of the commands that run the engine on a model here (generate, eval, serve): where the
// model runs (--device) and whether decode steps replay CUDA graphs (--cuda-graph).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/tensor.h"

namespace osprey::cli {

// --device cpu | cuda; anything else fails with a message naming the value.
Device parse_device_flag(const std::string& device);

void add_cuda_graph_flag(CLI::App* sub, bool& cuda_graph);

}  // namespace osprey::cli
