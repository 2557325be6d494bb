#include "dist/nccl_comm.h"

#ifdef OSPREY_WITH_CUDA
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "core/device_buffer.h"
#include "core/storage.h"
#endif

namespace osprey::dist {

#ifdef OSPREY_WITH_CUDA

namespace {

// The entry points osprey calls, resolved from libnccl.so.2 (declared by the toolkit's nccl.h).
struct NcclApi {
  void* lib = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  std::string error;  // why it could not be loaded
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    NcclApi a;
    a.lib = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!a.lib) {
      a.error = str_cat("cannot open libnccl.so.2 (", ::dlerror(),
                        "): install NCCL or add the CUDA toolkit's lib64 to LD_LIBRARY_PATH");
      return a;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(a.lib, name));
      if (!fn && a.error.empty()) a.error = str_cat("libnccl.so.2 has no ", name);
    };
    sym(a.get_version, "ncclGetVersion");
    sym(a.get_unique_id, "ncclGetUniqueId");
    sym(a.init_rank_config, "ncclCommInitRankConfig");
    sym(a.async_error, "ncclCommGetAsyncError");
    sym(a.abort, "ncclCommAbort");
    sym(a.destroy, "ncclCommDestroy");
    sym(a.error_string, "ncclGetErrorString");
    sym(a.all_reduce, "ncclAllReduce");
    sym(a.all_gather, "ncclAllGather");
    sym(a.broadcast, "ncclBroadcast");
    sym(a.send, "ncclSend");
    sym(a.recv, "ncclRecv");
    sym(a.group_start, "ncclGroupStart");
    sym(a.group_end, "ncclGroupEnd");
    return a;
  }();
  if (!api.error.empty()) fail(api.error);
  return api;
}

// How often the watchdog looks at the stream and the communicator's error state.
constexpr auto kPollInterval = std::chrono::microseconds(20);

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& boot, double timeout_s, bool watchdog)
      : rank_(boot.rank()), size_(boot.size()), timeout_s_(timeout_s), watchdog_(watchdog) {
    const NcclApi& n = nccl();
    ncclUniqueId id;
    std::vector<uint8_t> bytes(sizeof id);
    if (rank_ == 0) {
      check(n.get_unique_id(&id), "ncclGetUniqueId");
      std::memcpy(bytes.data(), &id, sizeof id);
    }
    broadcast_bytes(boot, bytes, 0);
    OSPREY_CHECK(bytes.size() == sizeof id, "ncclUniqueId size");
    std::memcpy(&id, bytes.data(), sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // init and collectives return at once; wait() polls with a deadline
    ncclResult_t r = n.init_rank_config(&comm_, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) check(r, "ncclCommInitRankConfig");
    wait("ncclCommInitRankConfig", /*stream=*/false);
    scratch_ = Storage(Device::CUDA, DType::F32, {1});
  }
  ~NcclCommunicator() override {
    if (!comm_) return;
    const NcclApi& n = nccl();
    if (aborted_) return;
    n.destroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::CUDA; }
  const char* backend() const override { return "nccl"; }

  void all_reduce_sum(Tensor x) override {
    OSPREY_CHECK(x.dtype == DType::F32 && x.device == Device::CUDA, "all_reduce_sum: device F32");
    issue(
        nccl().all_reduce(x.data, x.data, size_t(x.numel()), ncclFloat32, ncclSum, comm_, nullptr),
        "ncclAllReduce");
  }
  void all_gather(Tensor out, Tensor in) override {
    OSPREY_CHECK(out.dtype == in.dtype && out.numel() == in.numel() * size_,
                 "all_gather: out must hold size × in");
    issue(nccl().all_gather(in.data, out.data, in.nbytes(), ncclUint8, comm_, nullptr),
          "ncclAllGather");
  }
  void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                   const std::vector<int64_t>& send_counts) override {
    const NcclApi& n = nccl();
    const size_t es = dtype_size(in.dtype);
    check(n.group_start(), "ncclGroupStart");
    size_t so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
      const size_t sc = size_t(send_counts[size_t(r)]) * es,
                   rc = size_t(recv_counts[size_t(r)]) * es;
      if (sc)
        check(n.send(static_cast<char*>(in.data) + so, sc, ncclUint8, r, comm_, nullptr),
              "ncclSend");
      if (rc)
        check(n.recv(static_cast<char*>(out.data) + ro, rc, ncclUint8, r, comm_, nullptr),
              "ncclRecv");
      so += sc;
      ro += rc;
    }
    issue(n.group_end(), "ncclGroupEnd (all_to_allv)");
  }
  void broadcast(Tensor x, int root) override {
    issue(nccl().broadcast(x.data, x.data, x.nbytes(), ncclUint8, root, comm_, nullptr),
          "ncclBroadcast");
  }
  void barrier() override { all_reduce_sum(scratch_.view()); }
  void abort(const std::string&) override {
    if (comm_ && !aborted_) {
      aborted_ = true;
      nccl().abort(comm_);
    }
  }

 private:
  void check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    throw CommError(str_cat("rank ", rank_, ": ", what, " failed: ", nccl().error_string(r)));
  }
  void issue(ncclResult_t r, const char* what) {
    if (aborted_) throw CommError(str_cat("rank ", rank_, ": the NCCL communicator was aborted"));
    check(r, what);
    if (watchdog_) wait(what, /*stream=*/true);
  }
  // Until the communicator is ready (and the stream has drained, when `stream`), or throws.
  void wait(const char* what, bool stream) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s_));
    while (true) {
      ncclResult_t st = ncclSuccess;
      nccl().async_error(comm_, &st);
      if (st != ncclSuccess && st != ncclInProgress) {
        abort("");
        throw CommError(str_cat("rank ", rank_, ": ", what, ": ", nccl().error_string(st)));
      }
      if (st == ncclSuccess) {
        if (!stream) return;
        const cudaError_t q = cudaStreamQuery(nullptr);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady)
          throw CommError(str_cat("rank ", rank_, ": ", what, ": ", cudaGetErrorString(q)));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        abort("");
        throw CommError(str_cat("rank ", rank_, ": ", what, " did not complete within ", timeout_s_,
                                " s: a peer rank failed or hangs (NCCL aborted)"));
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  int rank_, size_;
  double timeout_s_;
  bool watchdog_;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  Storage scratch_;  // [1] F32: the barrier's all-reduce
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, double timeout_s,
                                                     bool watchdog) {
  return std::make_unique<NcclCommunicator>(bootstrap, timeout_s, watchdog);
}

int nccl_version() {
  try {
    int v = 0;
    nccl().get_version(&v);
    return v;
  } catch (const Error&) {
    return 0;
  }
}

#else

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, double, bool) {
  fail("this build has no CUDA backend, so no NCCL: rebuild where nvcc is installed");
}
int nccl_version() {
  return 0;
}

#endif

}  // namespace osprey::dist
