#include "cli/engine_flags.h"

#include "core/error.h"

namespace osprey::cli {

Device parse_device_flag(const std::string& device) {
  if (device != "cpu" && device != "cuda") fail("--device must be cpu or cuda, got '", device, "'");
  return device == "cuda" ? Device::CUDA : Device::CPU;
}

void add_cuda_graph_flag(CLI::App* sub, bool& cuda_graph) {
  sub->add_flag("--cuda-graph", cuda_graph,
                "run pure decode steps as replays of CUDA graphs captured per padded batch size "
                "(vLLM's buckets 1, 2, 4, 8, 16, ... up to max_num_seqs; prefill and mixed steps "
                "stay eager; GPU only; default off, the eager steps vLLM's --enforce-eager gives)");
}

}  // namespace osprey::cli
