// The ranks of a parallel model that live in this process, loaded shard by shard and stepping in
// lockstep with rank 0 (model/lockstep.h).
//   CPU, one node:  every rank is a thread here (ThreadCommunicator: the CPU twin of CI).
//   CPU, --nnodes:  this node's ranks are threads here, every rank with its own TcpCommunicator
//                   to rank 0 at --master-addr:--master-port (processes over TCP).
//   CUDA:           one rank per process (the CUDA ops keep per-process state); control over TCP,
//                   activations over NCCL bootstrapped from it. cli/launch spawns the processes.
// Each rank reads only its slices of the checkpoint (model/shard.h) and prints its load progress.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/communicator.h"
#include "dist/parallel_config.h"
#include "model/deepseek.h"
#include "model/lockstep.h"

namespace osprey {

struct RankGroupOptions {
  Device device = Device::CPU;
  const ModelConfig* config = nullptr;  // replaces config.json when set
  bool dummy_weights = false;           // CUDA: random weights (--load-format dummy)
  uint64_t dummy_seed = 0;
};

class RankGroup {
 public:
  // Loads this process's ranks of the model in `dir`; returns once every rank of the world has
  // loaded (or throws naming the rank that failed).
  RankGroup(const std::string& dir, const dist::ParallelConfig& p, const RankGroupOptions& o = {});
  // Stops the other ranks (rank 0's process) and joins this process's rank threads.
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  // Whether rank 0 (the engine's model) is in this process.
  bool has_leader() const { return leader_ != nullptr; }
  // Rank 0's model (valid while the group lives, unless taken).
  DeepseekModel& leader() const { return *leader_; }
  // Rank 0's model handed to the caller, who must destroy it before the group (it talks to the
  // other ranks through the group's communicators).
  std::unique_ptr<DeepseekModel> take_leader() { return std::move(models_[0]); }
  // A process without rank 0: blocks until rank 0 stops the world (or throws its failure).
  void serve_until_stopped();

 private:
  void run_rank(int local, const std::string& dir, const dist::ParallelConfig& p,
                const RankGroupOptions& o);

  std::vector<std::unique_ptr<dist::Communicator>> control_;  // [local ranks] host
  std::vector<std::unique_ptr<dist::Communicator>> data_;     // [local ranks] NCCL (CUDA only)
  std::vector<std::unique_ptr<DeepseekModel>> models_;        // [local ranks]
  std::vector<std::string> errors_;                           // [local ranks]
  std::vector<std::thread> threads_;                          // local ranks but rank 0
  std::unique_ptr<StepPublisher> publisher_;
  DeepseekModel* leader_ = nullptr;
  int first_rank_ = 0;
  bool stopped_ = false;
};

}  // namespace osprey
