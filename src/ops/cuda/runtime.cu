// Runtime pieces shared by the CUDA twins: the scratch arena, the cuBLASLt handle and matmul
// helper, and the F32 ↔ BF16 conversion kernel.
//   convert: dst[i] = src[i], i < n; grid-stride, one element per thread per step.
#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/cuda/stream_fork.h"
#include "ops/tensor_ops.h"

namespace osprey::ops::cuda {

namespace {
struct Arena {
  void* ptr[kScratchCount] = {};
  size_t size[kScratchCount] = {};
};
// One arena a lane: lane 0 the ops of a thread's stream, lane 1 those of an ops::Fork's side
// (ops/stream_fork.h), so that ops running at once on the two streams never share a slot.
thread_local int t_lane = 0;
Arena& arena(int lane) {
  static Arena a[kScratchLanes];
  return a[lane];
}
Arena& arena() {
  return arena(t_lane);
}

template <typename D, typename S>
__global__ void convert_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  pdl_wait();
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_f32<D>(to_f32(src[i]));
}

void check_lt(cublasStatus_t s, const char* what) {
  OSPREY_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLASLt ", what, " failed: status ", int(s));
}
}  // namespace

namespace {
std::atomic<uint64_t> g_device_memory_epoch{0};
}  // namespace

uint64_t device_memory_epoch() {
  return g_device_memory_epoch.load();
}
void bump_device_memory_epoch() {
  ++g_device_memory_epoch;
}

// CUDA graphs: growth synchronises and frees, so it must never happen inside a capture (a runner
// runs each bucket's step eagerly first), and a graph captured before a growth is stale (epoch).
void* scratch(ScratchSlot slot, size_t bytes) {
  Arena& a = arena();
  if (bytes <= a.size[slot]) return a.ptr[slot];
  bump_device_memory_epoch();
  OSPREY_CUDA_CHECK(cudaDeviceSynchronize());
  if (a.ptr[slot]) OSPREY_CUDA_CHECK(cudaFree(a.ptr[slot]));
  bytes = (bytes + (1u << 20) - 1) / (1u << 20) * (1u << 20);
  const cudaError_t e = cudaMalloc(&a.ptr[slot], bytes);
  if (e != cudaSuccess)
    fail("out of GPU memory for ", bytes, " bytes of scratch: ", cudaGetErrorString(e));
  a.size[slot] = bytes;
  return a.ptr[slot];
}

int scratch_lane() {
  return t_lane;
}
int set_scratch_lane(int lane) {
  OSPREY_CHECK(lane >= 0 && lane < kScratchLanes, "scratch lane ", lane);
  return std::exchange(t_lane, lane);
}

void fill_scratch(int byte) {
  for (int lane = 0; lane < kScratchLanes; ++lane) {
    const Arena& a = arena(lane);
    for (int slot = 0; slot < kScratchCount; ++slot)
      if (a.ptr[slot] && slot != kScratchLtWorkspace)  // cuBLASLt's own between its calls
        OSPREY_CUDA_CHECK(cudaMemset(a.ptr[slot], byte, a.size[slot]));
  }
  OSPREY_CUDA_CHECK(cudaDeviceSynchronize());  // done before work on any stream reads it
}

cublasLtHandle_t lt_handle() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t x = nullptr;
    check_lt(cublasLtCreate(&x), "create");
    return x;
  }();
  return h;
}

namespace {
// What lt_matmul's heuristic query depends on (the descriptors and the preference it builds from
// these; pointers play no part): one algorithm choice per distinct GEMM.
using LtKey = std::array<int64_t, 17>;
struct LtChoice {
  bool found = false;  // cuBLASLt has an algorithm for the combination
  cublasLtMatmulAlgo_t algo{};
};
struct LtAlgoCache {
  std::mutex mu;
  std::map<LtKey, LtChoice> choices;
  LtAlgoStats stats;
};
LtAlgoCache& lt_cache() {
  static LtAlgoCache c;
  return c;
}

// What `run` (one cublasLtMatmul on the stream it is given) records: captured, never run, into a
// throwaway graph on a private stream of this thread. cuBLASLt issues its own cudaMemsetAsync for
// some algorithms (zeroed counters or flags in the workspace, or a zero-filled output): 4 bytes in
// the dsv32 decode graphs at B=1 and B=16 after the in-place split-K scheme was masked out, so a
// reduction-scheme mask does not catch them all; the graph does.
enum class Recorded {
  KernelsOnly,
  OtherNodes,  // a memset (or copy, host, ...) node among them
  Failed       // the capture did not complete (a one-time set-up call of the library inside it?)
};
template <typename Run>
Recorded record(const Run& run) {
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    (void)cudaGetLastError();
    return Recorded::Failed;
  }
  Recorded out = Recorded::Failed;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    const cublasStatus_t st = run(s);
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(s, &g);
    size_t n = 0;
    if (st == CUBLAS_STATUS_SUCCESS && e == cudaSuccess && g &&
        cudaGraphGetNodes(g, nullptr, &n) == cudaSuccess && n > 0) {
      std::vector<cudaGraphNode_t> nodes(n);
      if (cudaGraphGetNodes(g, nodes.data(), &n) == cudaSuccess) {
        out = Recorded::KernelsOnly;
        for (size_t i = 0; i < n; ++i) {
          cudaGraphNodeType t{};
          if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess) {
            out = Recorded::Failed;
            break;
          }
          if (t != cudaGraphNodeTypeKernel) out = Recorded::OtherNodes;
        }
      }
    }
    if (g) cudaGraphDestroy(g);
  }
  // A refused capture leaves its (non-sticky) error behind: it is not the caller's op's.
  if (out == Recorded::Failed) (void)cudaGetLastError();
  cudaStreamDestroy(s);
  return out;
}

// Whether this thread's ops are being captured now (or a capture elsewhere forbids the query).
bool capturing() {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream(), &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return st != cudaStreamCaptureStatusNone;
}
}  // namespace

LtAlgoStats lt_algo_stats() {
  LtAlgoCache& c = lt_cache();
  const std::lock_guard<std::mutex> lock(c.mu);
  return c.stats;
}

bool lt_matmul(int64_t m, int64_t n, int64_t k, const LtOperand& a, const LtOperand& b, void* d,
               cudaDataType_t d_type, int64_t ldd, int64_t d_batch_stride, int batch) {
  // CUDA graphs: the descriptors below are host-only calls (legal inside a capture); the workspace
  // is a fixed-size scratch slot allocated by the first (eager) call.
  // Split-K: only the reduction schemes that write D once are asked for (partials in the
  // workspace, reduced by a second kernel: COMPUTE_TYPE, OUTPUT_TYPE). The in-place scheme
  // accumulates into D with counters in the workspace, so cuBLASLt zero-fills both first: a
  // memset node in every captured step that takes it. The output is overwritten anyway
  // (beta = 0): the fill is waste.
  // The algorithm: cuBLASLt's heuristic candidates in its order, the first whose matmul records
  // as kernels only (no memset node: some algorithms zero a counter of their own, see record()),
  // chosen once per GEMM on its first eager call and kept: the same algorithm eager and in every
  // graph, and no heuristic query per call. If every candidate records other nodes, up to 32 more
  // without split-K, the same way; if none of those either, the heuristic's first (lt_algo_stats
  // counts it). Inside a capture, a GEMM not seen eagerly before takes the heuristic's first,
  // unkept (a graph runner runs each step eagerly before it captures it, so this does not happen
  // there).
  constexpr uint32_t kReductionSchemes = CUBLASLT_REDUCTION_SCHEME_NONE |
                                         CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                                         CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  constexpr size_t kWorkspaceBytes = 32u << 20;
  // Heuristic candidates tried for a kernels-only capture: the heuristic's first few (its order is
  // its estimate of speed; further down they get slower).
  constexpr int kCandidates = 8;
  // Where none of those records as kernels only: this many more, without split-K, tried the same
  // way (each try is one throwaway capture, once per distinct GEMM shape).
  constexpr int kWiderCandidates = 32;
  void* workspace = scratch(kScratchLtWorkspace, kWorkspaceBytes);
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  check_lt(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t ta = a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
           "transa");
  check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
           "transb");
  if (a.scale_mode >= 0) {
    const auto mode = cublasLtMatmulMatrixScale_t(a.scale_mode);
    check_lt(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)),
        "a mode");
    check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.scale,
                                            sizeof(a.scale)),
             "a scale");
  }
  if (b.scale_mode >= 0) {
    const auto mode = cublasLtMatmulMatrixScale_t(b.scale_mode);
    check_lt(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)),
        "b mode");
    check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b.scale,
                                            sizeof(b.scale)),
             "b scale");
  }
  check_lt(cublasLtMatrixLayoutCreate(&la, a.type, a.trans ? k : m, a.trans ? m : k, a.ld),
           "layout a");
  check_lt(cublasLtMatrixLayoutCreate(&lb, b.type, b.trans ? n : k, b.trans ? k : n, b.ld),
           "layout b");
  check_lt(cublasLtMatrixLayoutCreate(&ld, d_type, m, n, ldd), "layout d");
  if (batch > 1) {
    const int32_t count = batch;
    for (auto [l, stride] : {std::pair{la, a.batch_stride}, std::pair{lb, b.batch_stride},
                             std::pair{ld, d_batch_stride}}) {
      check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                sizeof(count)),
               "batch");
      check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof(stride)),
               "stride");
    }
  }
  const float alpha = 1.0f, beta = 0.0f;
  auto matmul = [&](const cublasLtMatmulAlgo_t& algo, cudaStream_t s) {
    return cublasLtMatmul(lt_handle(), op, &alpha, a.ptr, la, b.ptr, lb, &beta, d, ld, d, ld, &algo,
                          workspace, kWorkspaceBytes, s);
  };

  const bool batched = batch > 1;  // the strides matter only then
  const LtKey key{m,
                  n,
                  k,
                  int64_t(a.type),
                  int64_t(a.trans),
                  a.ld,
                  int64_t(a.scale_mode),
                  int64_t(b.type),
                  int64_t(b.trans),
                  b.ld,
                  int64_t(b.scale_mode),
                  int64_t(d_type),
                  ldd,
                  int64_t(batch),
                  batched ? a.batch_stride : 0,
                  batched ? b.batch_stride : 0,
                  batched ? d_batch_stride : 0};
  LtAlgoCache& cache = lt_cache();
  std::optional<LtChoice> choice;
  {
    const std::lock_guard<std::mutex> lock(cache.mu);
    if (auto it = cache.choices.find(key); it != cache.choices.end()) choice = it->second;
  }
  if (!choice) {
    // Up to `count` heuristic candidates under a reduction-scheme mask, in the heuristic's order,
    // into heur[]; returns how many.
    auto candidates = [&](uint32_t schemes, int count, cublasLtMatmulHeuristicResult_t* heur) {
      cublasLtMatmulPreference_t pref = nullptr;
      check_lt(cublasLtMatmulPreferenceCreate(&pref), "pref");
      check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &kWorkspaceBytes, sizeof(kWorkspaceBytes)),
               "pref ws");
      check_lt(cublasLtMatmulPreferenceSetAttribute(
                   pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)),
               "pref reduction");
      int found = 0;
      const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt_handle(), op, la, lb, ld, ld,
                                                               pref, count, heur, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      return hs == CUBLAS_STATUS_SUCCESS ? std::max(found, 0) : 0;
    };
    // The first of heur[0 .. n) whose matmul records as kernels only, or −1.
    auto first_clean = [&](const cublasLtMatmulHeuristicResult_t* heur, int n) {
      for (int i = 0; i < n; ++i) {
        if (heur[i].state != CUBLAS_STATUS_SUCCESS) continue;
        const cublasLtMatmulAlgo_t algo = heur[i].algo;
        auto run = [&](cudaStream_t s) { return matmul(algo, s); };
        Recorded rec = record(run);
        if (rec == Recorded::Failed) rec = record(run);  // once more, past a one-time set-up
        if (rec == Recorded::KernelsOnly) return i;
      }
      return -1;
    };
    cublasLtMatmulHeuristicResult_t heur[kCandidates] = {};
    const int found = candidates(kReductionSchemes, kCandidates, heur);
    LtChoice c;
    if (found > 0) {
      c.found = true;
      c.algo = heur[0].algo;
    }
    const bool keep = !c.found || !capturing();
    int taken = 0;  // the candidate kept: its index, or −1 when none captures as kernels only
    if (c.found && keep) {
      taken = first_clean(heur, found);
      if (taken > 0) c.algo = heur[taken].algo;
      if (taken < 0) {
        // None of the first few: a wider query without split-K (no workspace partials to zero)
        // before settling for a memset node in every graph of this GEMM (the dsv32 verify graph
        // at B = 64 held 17 of them, cuBLASLt's, at 192 tokens).
        cublasLtMatmulHeuristicResult_t plain[kWiderCandidates] = {};
        const int n = candidates(CUBLASLT_REDUCTION_SCHEME_NONE, kWiderCandidates, plain);
        const int i = first_clean(plain, n);
        if (i >= 0) {
          c.algo = plain[i].algo;
          taken = kCandidates + i;  // a later choice than the first query's
        }
      }
    }
    const std::lock_guard<std::mutex> lock(cache.mu);
    if (keep && cache.choices.emplace(key, c).second) {
      ++cache.stats.gemms;
      cache.stats.later_choice += taken > 0;
      cache.stats.no_clean_choice += taken < 0;
    }
    if (!keep) ++cache.stats.unkept_in_capture;
    choice = c;
  }
  bool ran = false;
  if (choice->found) {
    check_lt(matmul(choice->algo, stream()), "matmul");
    ran = true;
  }
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(op);
  return ran;
}

void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  if (n == 0) return;
  if (dst_type == src_type) {
    OSPREY_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * dtype_size(src_type),
                                      cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  const int threads = 256;
  const int blocks = int(std::min<int64_t>((n + threads - 1) / threads, 65536));
  OSPREY_DISPATCH_FLOAT(dst_type, D, OSPREY_DISPATCH_FLOAT(src_type, S, {
                          launch_pdl(convert_kernel<D, S>, blocks, threads, 0, static_cast<D*>(dst),
                                     static_cast<const S*>(src), n);
                        }));
  OSPREY_CUDA_LAUNCH_CHECK();
}

bool device_is_sm90() {
  static const int ok = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major == 9 && minor == 0 ? 1 : 0;
  }();
  return ok != 0;
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    OSPREY_CUDA_CHECK(cudaGetDevice(&dev));
    OSPREY_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

}  // namespace osprey::ops::cuda
