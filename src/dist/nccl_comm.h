// The GPU backend of the communicator: NCCL (libnccl.so.2 of the CUDA toolkit, opened at run time
// with dlopen so that a build without it still links, and its absence is a clear error, not a
// missing symbol). One process per GPU; buffers are device memory on the current device; work is
// issued on the stream the CUDA ops use (the legacy default stream), so it orders with them.
//
// Bootstrap: rank 0 makes the ncclUniqueId (NCCL's own bootstrap: it holds rank 0's address) and
// it reaches the other ranks through a host communicator (the TCP twin across processes), then
// ncclCommInitRankConfig (non-blocking) connects them.
//
// Watchdog (default on): every collective waits for its completion while polling
// ncclCommGetAsyncError, and past the timeout aborts the communicator and throws CommError — a
// dead or hung peer is an error, never a hang. NCCL does not say which peer is missing; the host
// control plane (which every step crosses first) names it. With the watchdog off, collectives are
// only enqueued (what CUDA graph capture needs) and errors show at the next synchronisation.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace osprey::dist {

// A communicator over the ranks of `bootstrap` (same rank, same size), on the current CUDA device.
// Fails (osprey::Error) without CUDA, without libnccl.so.2, or when NCCL cannot connect.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap,
                                                     double timeout_s = comm_timeout_from_env(),
                                                     bool watchdog = true);
// Whether libnccl.so.2 can be opened here (its version as NCCL_VERSION_CODE, or 0).
int nccl_version();

}  // namespace osprey::dist
