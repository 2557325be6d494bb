// `osprey bench comm`: the collectives of a parallel model timed alone on W ranks, as nccl-tests
// reports them, at the message sizes of DeepSeek-V3.2's steps:
//   all_reduce  [T, hidden] F32 in place — the TP path's all-reduce after o_proj and after each
//               MLP/MoE (osprey reduces F32 activations: dist/communicator.h);
//   all_to_all  each rank sends T·topk rows of [hidden + 2] F32 (the EP dispatch's row: x | local
//               expert id | weight, model/moe_dispatch.h), spread evenly over the W ranks (uniform
//               routing), and receives as many.
// T (tokens) = 1 (a decode step of one sequence), 64 (a decode batch), 2048 (a prefill chunk).
// Per size: `warmup` untimed calls, then `iters` timed ones, each started after a barrier; an
// iteration's time is the slowest rank's host wall time around the call (the NCCL backend waits
// for the collective's completion, dist/nccl_comm.h); the median over iterations is reported with
// nccl-tests' bandwidths: algbw = bytes / time, busbw = algbw · 2(W−1)/W (all-reduce) or
// algbw · (W−1)/W (all-to-all), bytes being the buffer (all-reduce) or all a rank sends (all-to-
// all). The first call of each size checks the result (rank r's data is r + 1).
// The ranks launch as `osprey serve`'s do: threads on the CPU (one node), TCP processes with
// --nnodes, one process per GPU with NCCL (--device cuda, bootstrapped over TCP).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "dist/parallel_config.h"

namespace osprey::bench {

// DeepSeek-V3.2's hidden size and routed experts per token.
constexpr int64_t kV32Hidden = 7168;
constexpr int kV32TopK = 8;

struct CommBenchOptions {
  std::vector<int64_t> tokens = {1, 64, 2048};
  int64_t hidden = kV32Hidden;
  int topk = kV32TopK;
  int warmup = 5;
  int iters = 20;
  bool all_reduce = true, all_to_all = true;
};

struct CommBenchRow {
  std::string op;  // "all_reduce" | "all_to_all"
  int64_t tokens = 0;
  int64_t bytes = 0;  // nccl-tests' size: the buffer (all-reduce), a rank's sends (all-to-all)
  double median_s = 0;
  double algbw_gbs = 0;  // bytes / median_s / 1e9
  double busbw_gbs = 0;  // algbw · bus_bandwidth_factor
};

// nccl-tests' factor from algorithm to bus bandwidth: 2(W−1)/W for all-reduce, (W−1)/W for
// all-to-all. Fails on another op name or world < 1.
double bus_bandwidth_factor(const std::string& op, int world);
// Bytes of the op's message at `tokens` (CommBenchRow::bytes).
int64_t comm_message_bytes(const std::string& op, int64_t tokens, const CommBenchOptions& o,
                           int world);

// One rank's part: every rank calls it with its communicators (`data` for the collectives, on
// its device; `host` a host communicator of the same ranks for the timings). Rows identical on
// every rank. Fails (osprey::Error) when a collective's result is wrong.
std::vector<CommBenchRow> run_comm_rank(dist::Communicator& data, dist::Communicator& host,
                                        const CommBenchOptions& o);

// This process's ranks of `p` launched on `device`, each running run_comm_rank; rank 0's
// process prints the table and returns the rows (other processes: empty).
std::vector<CommBenchRow> run_comm_benchmark(const dist::ParallelConfig& p, Device device,
                                             const CommBenchOptions& o);

std::string format_comm_table(const std::vector<CommBenchRow>& rows, int world,
                              const std::string& backend);

}  // namespace osprey::bench
