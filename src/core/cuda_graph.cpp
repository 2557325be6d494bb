#include "core/cuda_graph.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "core/cuda_driver.h"
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

namespace {
// The name of the kernel a kernel node launches, demangled, without its parameter list; "" when
// the node is no kernel or the driver names none. A node holds a CUfunction, or a CUkernel when
// func is null (the runtime's context-independent loading).
std::string kernel_name(cudaGraphNode_t node) {
  static const auto get_params =
      driver_entry<PFN_cuGraphKernelNodeGetParams_v12000>("cuGraphKernelNodeGetParams", 12000);
  static const auto func_name = driver_entry<PFN_cuFuncGetName_v12030>("cuFuncGetName", 12030);
  static const auto kern_name = driver_entry<PFN_cuKernelGetName_v12030>("cuKernelGetName", 12030);
  cudaGraphNodeType t{};
  if (cudaGraphNodeGetType(node, &t) != cudaSuccess || t != cudaGraphNodeTypeKernel) return "";
  CUDA_KERNEL_NODE_PARAMS_v2 p{};
  if (!get_params || get_params(node, &p) != CUDA_SUCCESS) return "";
  const char* name = nullptr;
  if (p.func && func_name) {
    if (func_name(&name, p.func) != CUDA_SUCCESS) name = nullptr;
  } else if (p.kern && kern_name) {
    if (kern_name(&name, p.kern) != CUDA_SUCCESS) name = nullptr;
  }
  if (!name) return "";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  // The parameter list is the last balanced (...) group; an earlier '(' belongs to the name
  // itself, e.g. "osprey::ops::cuda::(anonymous namespace)::moe_route_kernel<...>(...)".
  if (!out.empty() && out.back() == ')') {
    int depth = 0;
    for (size_t i = out.size(); i-- > 0;) {
      if (out[i] == ')') ++depth;
      if (out[i] == '(' && --depth == 0) {
        out.resize(i);
        break;
      }
    }
  }
  if (out.rfind("void ", 0) == 0) out.erase(0, 5);
  return out;
}

// The kernels a node follows and precedes in the graph ("?" where none or unnamed).
std::string neighbours(cudaGraphNode_t node) {
  auto names = [](cudaGraphNode_t x, bool before) {
    size_t n = 0;
    const cudaError_t e = before ? cudaGraphNodeGetDependencies(x, nullptr, nullptr, &n)
                                 : cudaGraphNodeGetDependentNodes(x, nullptr, nullptr, &n);
    std::string out;
    if (e != cudaSuccess || n == 0) return std::string("?");
    std::vector<cudaGraphNode_t> v(n);
    if ((before ? cudaGraphNodeGetDependencies(x, v.data(), nullptr, &n)
                : cudaGraphNodeGetDependentNodes(x, v.data(), nullptr, &n)) != cudaSuccess)
      return std::string("?");
    for (cudaGraphNode_t y : v) {
      const std::string k = kernel_name(y);
      out += (out.empty() ? "" : ", ") + (k.empty() ? std::string("?") : k);
    }
    return out;
  };
  std::string s = "after " + names(node, true) + "; before " + names(node, false);
  (void)cudaGetLastError();
  return s;
}
}  // namespace

GraphNodeCounts graph_node_counts(void* graph, bool names) {
  GraphNodeCounts c;
  if (!graph) return c;
  const auto g = static_cast<cudaGraph_t>(graph);
  size_t n = 0;
  if (cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess) return c;
  std::vector<cudaGraphNode_t> nodes(n);
  if (cudaGraphGetNodes(g, nodes.data(), &n) != cudaSuccess) return c;
  for (cudaGraphNode_t node : nodes) {
    size_t deps = 0;
    if (cudaGraphNodeGetDependencies(node, nullptr, nullptr, &deps) == cudaSuccess && deps > 1)
      ++c.joins;
    cudaGraphNodeType t{};
    cudaGraphNodeGetType(node, &t);
    switch (t) {
      case cudaGraphNodeTypeKernel:
        ++c.kernels;
        if (names) c.kernel_names.push_back(kernel_name(node));
        break;
      case cudaGraphNodeTypeMemset: {
        ++c.memsets;
        cudaMemsetParams p{};
        c.memset_bytes.push_back(cudaGraphMemsetNodeGetParams(node, &p) == cudaSuccess
                                     ? int64_t(p.width) * int64_t(p.height) * int64_t(p.elementSize)
                                     : -1);
        c.memset_neighbours.push_back(neighbours(node));
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

GraphNodeCounts CudaGraph::nodes() const {
  return graph_node_counts(graph_, false);
}

}  // namespace osprey::cuda
