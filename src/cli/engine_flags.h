// Flags of the commands that run the engine on a model here (generate, eval, serve): where the
// model runs (--device) and whether decode and verify steps replay CUDA graphs (on by default on
// the GPU;
// --enforce-eager turns them off, --cuda-graph insists on them).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace osprey::cli {

// --device cpu | cuda; anything else fails with a message naming the value.
Device parse_device_flag(const std::string& device);

// --cuda-graph / --enforce-eager / --cuda-graph-sizes, as the user gave them.
struct CudaGraphFlags {
  bool cuda_graph = false;     // asked for explicitly: an error where graphs cannot run
  bool enforce_eager = false;  // vLLM's --enforce-eager: every step eager
  std::vector<int> sizes;      // --cuda-graph-sizes (empty: cuda_graph_capture_sizes' default)
};
void add_cuda_graph_flags(CLI::App* sub, CudaGraphFlags& flags);

// Whether the engine replays decode and verify steps as CUDA graphs (EngineConfig::cuda_graph): by
// default yes for a model on the GPU that is not split over ranks (the graph runner serves one
// GPU), no on the CPU; never with --enforce-eager. --cuda-graph turns the default into a
// requirement (the graph runner then names what is missing); both flags at once fail.
bool use_cuda_graph(const CudaGraphFlags& flags, Device model_device, bool parallel_model);

}  // namespace osprey::cli
