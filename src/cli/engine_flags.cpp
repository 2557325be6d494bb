#include "cli/engine_flags.h"

#include "core/error.h"

namespace osprey::cli {

Device parse_device_flag(const std::string& device) {
  if (device != "cpu" && device != "cuda") fail("--device must be cpu or cuda, got '", device, "'");
  return device == "cuda" ? Device::CUDA : Device::CPU;
}

void add_cuda_graph_flags(CLI::App* sub, CudaGraphFlags& flags) {
  sub->add_flag("--cuda-graph", flags.cuda_graph,
                "require CUDA graphs for pure decode and speculative verify steps (the default "
                "on the GPU): a step is the replay of a graph captured per padded batch size "
                "(vLLM's buckets 1, 2, 4, 8, 16, ... up to max_num_seqs) and tokens a sequence "
                "(1, or 1 + num_speculative_tokens); prefill and mixed steps and the MTP "
                "drafter's steps stay eager; an error where graphs cannot run (CPU, a parallel "
                "model)");
  sub->add_option("--cuda-graph-sizes", flags.sizes,
                  "the batch sizes a decode graph is captured for, comma-separated (vLLM's "
                  "--cuda-graph-sizes; default 1, 2, 4, then every 8 up to max_num_seqs, and "
                  "max_num_seqs); a batch runs in the smallest size that holds "
                  "it, eagerly when none does")
      ->delimiter(',');
  sub->add_flag("--enforce-eager", flags.enforce_eager,
                "run every step eagerly, op by op (no CUDA graphs), as vLLM's --enforce-eager");
}

bool use_cuda_graph(const CudaGraphFlags& flags, Device model_device, bool parallel_model) {
  if (flags.cuda_graph && flags.enforce_eager)
    fail("--cuda-graph and --enforce-eager contradict each other: give one");
  if (flags.enforce_eager && !flags.sizes.empty())
    fail("--cuda-graph-sizes and --enforce-eager contradict each other: give one");
  if (flags.enforce_eager) return false;
  if (flags.cuda_graph) return true;  // the graph runner fails with the reason if it cannot
  const bool on = model_device == Device::CUDA && !parallel_model;
  if (!on && !flags.sizes.empty())
    fail(
        "--cuda-graph-sizes needs CUDA graphs, which run for a model on one GPU only (this one is ",
        model_device == Device::CUDA ? "split over ranks" : "on the CPU", ")");
  return on;
}

}  // namespace osprey::cli
