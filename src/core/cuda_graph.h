// CudaGraph: one captured and instantiated CUDA graph, and what it holds (cudaGraphGetNodes).
// Only built with the CUDA backend (OSPREY_WITH_CUDA); this header needs no CUDA headers.
//
// capture(f) runs f with this thread's ops on a private non-blocking stream (cuda::StreamScope; the
// legacy default stream cannot be captured) in thread-local capture mode: a call from f that would
// synchronise or use the legacy stream (cudaMalloc/cudaFree of a growing arena, a cudaMemcpy, a
// device→host read) ends the capture with an error, reported as osprey::Error with the CUDA
// message. launch() replays the graph on the legacy default stream, so it is ordered with the
// eager ops, copies and sampling around it exactly as the eager step would be.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace osprey::cuda {

struct GraphNodeCounts {
  int kernels = 0, memsets = 0, memcpys = 0, hosts = 0, others = 0;
  // Nodes with more than one dependency: where branches of the graph meet (ops::Fork's joins).
  int joins = 0;
  // Bytes each memset node fills, in node order (which buffer a stray memset clears: a GEMM's
  // output is rows × columns × dtype, a split-K counter array a few KB).
  std::vector<int64_t> memset_bytes;
  // Per memset node, the kernels around it: "after <kernel>; before <kernel>" (demangled names;
  // "?" where the driver names none): the op that issued it is the one before, or the library
  // call whose kernel comes after (cuBLASLt zero-fills a counter before its GEMM kernel).
  std::vector<std::string> memset_neighbours;
  // The kernel nodes' names (demangled, without parameter lists; "" where the driver names none),
  // in node order: filled only when asked for (graph_node_counts).
  std::vector<std::string> kernel_names;
  int total() const { return kernels + memsets + memcpys + hosts + others; }
};

// What a graph holds, node by node (graph: a cudaGraph_t); with the kernels' names if asked.
GraphNodeCounts graph_node_counts(void* graph, bool kernel_names);

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(CudaGraph&& o) noexcept;
  CudaGraph& operator=(CudaGraph&& o) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Captures f() and instantiates the graph (replacing one held before). Throws osprey::Error
  // when the capture or the instantiation fails (this object then holds no graph).
  void capture(const std::function<void()>& f);
  // Replays the graph on the legacy default stream (asynchronous to the host).
  void launch() const;
  bool empty() const { return exec_ == nullptr; }
  GraphNodeCounts nodes() const;
  // The cudaGraph_t (tests read its nodes by kernel name); null when empty.
  void* raw_graph() const { return graph_; }

 private:
  void reset();
  void* stream_ = nullptr;  // cudaStream_t the capture ran on
  void* graph_ = nullptr;   // cudaGraph_t
  void* exec_ = nullptr;    // cudaGraphExec_t
};

}  // namespace osprey::cuda
