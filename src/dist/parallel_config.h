// How a model is spread over ranks, as vLLM's flags say it:
//   --tensor-parallel-size N   attention heads, dense MLPs, shared experts and lm_head split N ways
//                              (routed experts too: each expert's intermediate split);
//   --enable-expert-parallel   the routed experts partitioned whole over the ranks instead, tokens
//                              dispatched to them and combined back with all-to-all;
//   --data-parallel-size N     attention data parallel: each rank runs its own sequences' attention
//                              with full weights (with expert parallel: DP-attention + EP, the mode
//                              DeepSeek deploys; without: the MoE replicated too).
// World size = tp × dp (one of them 1). Ranks beyond one machine: --nnodes, --node-rank,
// --master-addr, --master-port (the ranks of a node are node_rank·(world/nnodes) + 0..).
#pragma once

#include <string>

namespace osprey::dist {

struct ParallelConfig {
  int tensor_parallel_size = 1;
  int data_parallel_size = 1;
  bool enable_expert_parallel = false;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  int world_size() const { return tensor_parallel_size * data_parallel_size; }
  int ranks_per_node() const { return world_size() / nnodes; }
  int first_local_rank() const { return node_rank * ranks_per_node(); }
  bool parallel() const { return world_size() > 1 || nnodes > 1 || enable_expert_parallel; }
  // Fails (osprey::Error) on sizes osprey cannot run, saying which flag to change.
  void validate() const;
  std::string describe() const;  // "TP4", "DP8+EP", ...
};

}  // namespace osprey::dist
