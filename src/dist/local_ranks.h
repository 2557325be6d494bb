// The host communicators of this process's ranks of a parallel run (serve's RankGroup, bench
// comm): the control plane every rank has, beside NCCL's data plane on CUDA.
//   One node on the CPU: every rank is a thread of this process (make_thread_group).
//   Otherwise: p.ranks_per_node() ranks from p.first_local_rank(), each connecting over TCP to
//   p.master_addr:p.master_port (TcpCommunicator); connecting blocks until every rank of the
//   world joined, so each local rank connects on its own thread.
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "dist/parallel_config.h"

namespace osprey::dist {

// [p.ranks_per_node()] communicators, index i = rank p.first_local_rank() + i. Throws the first
// rank's error when a connection fails (each connecting thread is joined first).
std::vector<std::unique_ptr<Communicator>> make_local_control_ranks(const ParallelConfig& p,
                                                                    Device device);

}  // namespace osprey::dist
