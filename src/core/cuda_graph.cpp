#include "core/cuda_graph.h"

#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "core/device_buffer.h"
#include "core/error.h"

namespace osprey::cuda {

CudaGraph::~CudaGraph() {
  reset();
}

CudaGraph::CudaGraph(CudaGraph&& o) noexcept
    : stream_(std::exchange(o.stream_, nullptr)),
      graph_(std::exchange(o.graph_, nullptr)),
      exec_(std::exchange(o.exec_, nullptr)) {}

CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  if (this != &o) {
    reset();
    stream_ = std::exchange(o.stream_, nullptr);
    graph_ = std::exchange(o.graph_, nullptr);
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}

void CudaGraph::reset() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  exec_ = graph_ = stream_ = nullptr;
}

void CudaGraph::capture(const std::function<void()>& f) {
  reset();
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) fail("CUDA graph: cudaStreamCreateWithFlags: ", cudaGetErrorString(e));
  stream_ = s;
  e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) fail("CUDA graph: cudaStreamBeginCapture: ", cudaGetErrorString(e));
  cudaGraph_t g = nullptr;
  try {
    StreamScope scope(s);
    f();
  } catch (...) {
    // End the capture (its graph, if any, is discarded) and clear the sticky capture error
    // before the caller sees the failure.
    if (cudaStreamEndCapture(s, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    reset();
    throw;
  }
  e = cudaStreamEndCapture(s, &g);
  if (e != cudaSuccess || !g) {
    (void)cudaGetLastError();
    reset();
    fail(
        "CUDA graph: the capture failed (a synchronising, allocating or legacy-stream call "
        "inside the step?): ",
        cudaGetErrorString(e));
  }
  graph_ = g;
  cudaGraphExec_t x = nullptr;
  e = cudaGraphInstantiate(&x, g, 0);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    reset();
    fail("CUDA graph: cudaGraphInstantiate: ", cudaGetErrorString(e));
  }
  exec_ = x;
}

void CudaGraph::launch() const {
  OSPREY_CHECK(exec_, "CUDA graph: launch of an empty graph");
  const cudaError_t e = cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), cudaStreamLegacy);
  if (e != cudaSuccess) fail("CUDA graph: cudaGraphLaunch: ", cudaGetErrorString(e));
}

GraphNodeCounts CudaGraph::nodes() const {
  GraphNodeCounts c;
  if (!graph_) return c;
  const auto g = static_cast<cudaGraph_t>(graph_);
  size_t n = 0;
  if (cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess) return c;
  std::vector<cudaGraphNode_t> nodes(n);
  if (cudaGraphGetNodes(g, nodes.data(), &n) != cudaSuccess) return c;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    cudaGraphNodeGetType(node, &t);
    switch (t) {
      case cudaGraphNodeTypeKernel:
        ++c.kernels;
        break;
      case cudaGraphNodeTypeMemset: {
        ++c.memsets;
        cudaMemsetParams p{};
        c.memset_bytes.push_back(cudaGraphMemsetNodeGetParams(node, &p) == cudaSuccess
                                     ? int64_t(p.width) * int64_t(p.height) * int64_t(p.elementSize)
                                     : -1);
        break;
      }
      case cudaGraphNodeTypeMemcpy:
        ++c.memcpys;
        break;
      case cudaGraphNodeTypeHost:
        ++c.hosts;
        break;
      default:
        ++c.others;
    }
  }
  return c;
}

}  // namespace osprey::cuda
