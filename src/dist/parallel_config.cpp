#include "dist/parallel_config.h"

#include "core/error.h"

namespace osprey::dist {

void ParallelConfig::validate() const {
  if (tensor_parallel_size < 1) fail("--tensor-parallel-size must be at least 1");
  if (data_parallel_size < 1) fail("--data-parallel-size must be at least 1");
  if (tensor_parallel_size > 1 && data_parallel_size > 1)
    fail("--tensor-parallel-size ", tensor_parallel_size, " with --data-parallel-size ",
         data_parallel_size,
         " is not supported: use one of them (TP, or DP attention with --enable-expert-parallel)");
  if (nnodes < 1) fail("--nnodes must be at least 1");
  if (world_size() % nnodes)
    fail("the world size ", world_size(), " (tp × dp) does not divide over --nnodes ", nnodes);
  if (node_rank < 0 || node_rank >= nnodes)
    fail("--node-rank must be in 0..", nnodes - 1, ", got ", node_rank);
  if (master_port <= 0 || master_port > 65535) fail("--master-port must be in 1..65535");
}

std::string ParallelConfig::describe() const {
  std::string s = data_parallel_size > 1 ? "DP" + std::to_string(data_parallel_size)
                                         : "TP" + std::to_string(tensor_parallel_size);
  if (enable_expert_parallel) s += "+EP";
  if (nnodes > 1) s += " over " + std::to_string(nnodes) + " nodes";
  return s;
}

}  // namespace osprey::dist
