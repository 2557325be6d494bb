// Capturing a call into a CUDA graph and reading what it launched: the kernel, memset, memcpy and
// host nodes (cudaGraphGetNodes), with each kernel's name. The budget tests of a step's pieces
// (tests/ops/test_cuda_graph.cpp) hold these counts, so that an added cast kernel or memset fails.
// The ops run on a non-blocking stream of the test's own through cuda::StreamScope (the legacy
// default stream cannot be captured). A call that grows scratch or synchronises cannot be captured:
// run it once eagerly first (warm_up), as a graph runner does.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_graph.h"
#include "core/device_buffer.h"

namespace osprey::testing {

#define OSPREY_CUDA_OK(expr)                                                   \
  do {                                                                         \
    const cudaError_t e_ = (expr);                                             \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(e_) << " " \
                               << cudaGetErrorString(e_);                      \
  } while (0)

struct GraphNodes {
  int kernels = 0, memsets = 0, memcpys = 0, hosts = 0, others = 0;
  std::vector<std::string> kernel_names;  // demangled; "?" where the driver gave none
  // Whether the driver named the kernels (checks by name are skipped, with a note, if not).
  bool names_known() const {
    for (const std::string& n : kernel_names)
      if (n != "?") return true;
    return false;
  }
  int kernels_named(const std::string& part) const {
    int k = 0;
    for (const std::string& n : kernel_names) k += n.find(part) != std::string::npos;
    return k;
  }
  std::string summary() const {
    std::string s = std::to_string(kernels) + " kernels, " + std::to_string(memsets) +
                    " memsets, " + std::to_string(memcpys) + " memcpys, " + std::to_string(hosts) +
                    " host nodes, " + std::to_string(others) + " other";
    for (const std::string& n : kernel_names) s += "\n    kernel " + n;
    return s;
  }
};

// The nodes of a captured graph, kernels by name (core/cuda_graph.h's count; "?" where the driver
// names a kernel none).
inline GraphNodes graph_nodes(cudaGraph_t graph) {
  const cuda::GraphNodeCounts c = cuda::graph_node_counts(graph, true);
  GraphNodes g;
  g.kernels = c.kernels;
  g.memsets = c.memsets;
  g.memcpys = c.memcpys;
  g.hosts = c.hosts;
  g.others = c.others;
  for (const std::string& n : c.kernel_names) g.kernel_names.push_back(n.empty() ? "?" : n);
  return g;
}

// A captured graph and its instantiation, destroyed together.
class CapturedGraph {
 public:
  CapturedGraph() = default;
  ~CapturedGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  // Captures f() (ops launched on this graph's stream) and instantiates the graph. Failures are
  // test failures (ASSERT inside: check HasFatalFailure() after).
  template <typename F>
  void capture(F&& f) {
    OSPREY_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    {
      cuda::StreamScope scope(stream_);
      OSPREY_CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      std::forward<F>(f)();
      const cudaError_t e = cudaStreamEndCapture(stream_, &graph_);
      ASSERT_EQ(e, cudaSuccess)
          << "capture failed (a synchronising or legacy-stream call inside?): "
          << cudaGetErrorString(e);
    }
    OSPREY_CUDA_OK(cudaGraphInstantiate(&exec_, graph_, 0));
  }

  GraphNodes nodes() const { return graph_nodes(graph_); }

  // Replays the graph once and waits for it. Work on the legacy stream (uploads, fills) is waited
  // for first: this graph's stream does not wait for it by itself.
  void replay() {
    OSPREY_CUDA_OK(cudaDeviceSynchronize());
    OSPREY_CUDA_OK(cudaGraphLaunch(exec_, stream_));
    OSPREY_CUDA_OK(cudaStreamSynchronize(stream_));
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace osprey::testing
