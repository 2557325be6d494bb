#include "cli/parallel_flags.h"

#include <cstdio>

namespace osprey::cli {

void add_parallel_flags(CLI::App* sub, dist::ParallelConfig& p) {
  sub->add_option("--tensor-parallel-size", p.tensor_parallel_size,
                  "ranks that split attention heads, MLPs and lm_head (vLLM's flag)");
  sub->add_option("--data-parallel-size", p.data_parallel_size,
                  "ranks that each run their own sequences' attention");
  sub->add_flag("--enable-expert-parallel", p.enable_expert_parallel,
                "routed experts partitioned over the ranks, tokens moved by all-to-all");
  sub->add_option("--nnodes", p.nnodes, "machines (processes) the ranks are spread over");
  sub->add_option("--node-rank", p.node_rank, "this machine's index (0 holds rank 0)");
  sub->add_option("--master-addr", p.master_addr, "address of the node with --node-rank 0");
  sub->add_option("--master-port", p.master_port, "port rank 0 listens on (default 29500)");
}

bool serve_worker_ranks(RankGroup* group) {
  if (!group || group->has_leader()) return false;
  group->serve_until_stopped();
  std::fprintf(stderr, "osprey: rank 0 stopped the ranks of this node\n");
  return true;
}

}  // namespace osprey::cli
