// The CPU twin of the communicator across processes: ranks are processes (on one machine over
// loopback, or on several), connected in a star to rank 0, which listens on master_addr:port.
// Rank 0 receives every rank's part of a collective, computes the result (sums in rank order, as
// the thread twin) and sends each rank its part back. Slow next to NCCL and meant for the CPU
// model and for host control messages (step metadata, NCCL's unique id), not for GPU activations.
//
// Failures: rank 0 names a rank that does not arrive within the timeout, closed its connection,
// or sent an abort, and relays that message to every other rank before it throws; the others
// wait a little longer than rank 0 does, so they report the rank that failed, not rank 0.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace osprey::dist {

struct TcpEndpoint {
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // torch.distributed's default MASTER_PORT
};

class TcpCommunicator final : public Communicator {
 public:
  // Connects the `world` ranks (rank 0 listens; the others connect, retrying until the timeout).
  TcpCommunicator(const TcpEndpoint& at, int rank, int world,
                  double timeout_s = comm_timeout_from_env());
  ~TcpCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return world_; }
  Device device() const override { return Device::CPU; }
  const char* backend() const override { return "cpu-tcp"; }
  void all_reduce_sum(Tensor x) override;
  void all_gather(Tensor out, Tensor in) override;
  void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                   const std::vector<int64_t>& send_counts) override;
  void broadcast(Tensor x, int root) override;
  void barrier() override;
  void abort(const std::string& why) override;

 private:
  struct Frame;
  void send_frame(int fd, uint32_t op, const std::vector<int64_t>& aux, const void* data, size_t n);
  // Waits at most timeout_s; a timeout's message names `reported_s` (the op's whole timeout, where
  // timeout_s is what is left of it), or timeout_s when reported_s < 0.
  Frame recv_frame(int fd, int from_rank, const char* op, double timeout_s, double reported_s = -1);
  // Rank 0: the frames of ranks 1..n−1 for `op`, or a CommError relayed to everyone.
  std::vector<Frame> gather_frames(uint32_t op, const char* name);
  [[noreturn]] void hub_fail(const std::string& why);
  Frame await_reply(uint32_t op, const char* name);

  int rank_, world_;
  double timeout_s_;
  int listen_fd_ = -1;
  std::vector<int> peers_;  // rank 0: fd of rank r (index r; [0] unused); others: [0] = rank 0
  bool failed_ = false;
};

}  // namespace osprey::dist
