// One communicator interface for the ranks of a parallel model (tensor, expert and data
// parallelism), with three backends behind it:
//   ThreadCommunicator (thread_comm.h): ranks are threads of one process over shared memory — the
//     CPU twin that CI runs;
//   TcpCommunicator (tcp_comm.h): ranks are processes (one machine or several) over TCP, every
//     message through rank 0 — the CPU twin across processes (`--nnodes`), and the host control
//     plane of NCCL runs;
//   NcclCommunicator (nccl_comm.h): ranks are GPUs, libnccl.so.2 from the CUDA toolkit.
//
// Every collective is called by every rank of the communicator in the same order (as NCCL's).
// Buffers live on device() (host memory for the CPU twins, GPU memory for NCCL) and are contiguous.
// Counts are elements. Results are identical on every rank (reductions sum in rank order 0..N−1
// in the twins, so the CPU twins are deterministic).
//
// Failures never hang: a rank that throws marks its communicator failed and every peer blocked in
// (or entering) a collective throws CommError naming that rank; a rank that does not arrive within
// the timeout makes the waiting ranks throw CommError naming the ranks that were missing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace osprey::dist {

// A collective that failed: a peer failed, hung past the timeout, or the ranks disagreed.
class CommError : public Error {
 public:
  explicit CommError(const std::string& what) : Error(what) {}
};

// How long a rank waits for its peers in one collective before it gives up (seconds): far above a
// decode step, below what a user waits before deciding the server hangs. OSPREY_DIST_TIMEOUT
// (seconds) overrides it.
constexpr double kDefaultCommTimeoutS = 120.0;
double comm_timeout_from_env();

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the buffers of this communicator live.
  virtual Device device() const = 0;
  virtual const char* backend() const = 0;

  // x = Σ over ranks of x, in place (F32).
  virtual void all_reduce_sum(Tensor x) = 0;
  // out [size · in.numel()] = the `in` of every rank, rank-major (out and in of one dtype).
  virtual void all_gather(Tensor out, Tensor in) = 0;
  // The segments of `in` go to the ranks in order: send_counts[j] elements to rank j; `out`
  // receives recv_counts[i] elements from each rank i, rank-major. Counts must agree pairwise
  // (what i sends j is what j receives from i); a mismatch is a CommError, never a short read.
  virtual void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                           const std::vector<int64_t>& send_counts) = 0;
  // x = root's x on every rank.
  virtual void broadcast(Tensor x, int root) = 0;
  virtual void barrier() = 0;
  // Marks this rank failed (called when it throws outside a collective), so that its peers stop
  // waiting for it and report `why`. Safe to call more than once.
  virtual void abort(const std::string& why) = 0;
};

// Host-side helpers over any communicator: the bytes of a host vector broadcast from root (sizes
// first), through a staging buffer on the communicator's device when that is not the host.
void broadcast_bytes(Communicator& c, std::vector<uint8_t>& bytes, int root);
// counts[j] of every rank i as a [size, size] matrix (row i: what rank i sends to each rank).
std::vector<int64_t> all_gather_counts(Communicator& c, const std::vector<int64_t>& counts);

}  // namespace osprey::dist
