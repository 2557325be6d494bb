// vLLM's parallelism flags on every command that runs a model (generate, logits, serve, eval):
// --tensor-parallel-size, --data-parallel-size, --enable-expert-parallel, and for several
// machines --nnodes, --node-rank, --master-addr, --master-port (dist/parallel_config.h).
#pragma once

#include <CLI/CLI.hpp>

#include "dist/parallel_config.h"
#include "model/rank_group.h"

namespace osprey::cli {

void add_parallel_flags(CLI::App* sub, dist::ParallelConfig& p);

// A process that holds ranks but not rank 0 (--node-rank > 0): runs them until rank 0 stops,
// prints what ended them, and returns true (the command is done); false in rank 0's process.
bool serve_worker_ranks(RankGroup* group);

}  // namespace osprey::cli
