#include "dist/communicator.h"

#include <cstdlib>

#include "core/storage.h"
#ifdef OSPREY_WITH_CUDA
#include "core/device_buffer.h"
#endif

namespace osprey::dist {

double comm_timeout_from_env() {
  const char* e = std::getenv("OSPREY_DIST_TIMEOUT");
  if (!e || !*e) return kDefaultCommTimeoutS;
  char* end = nullptr;
  const double s = std::strtod(e, &end);
  if (end == e || *end || !(s > 0))
    fail("OSPREY_DIST_TIMEOUT must be a positive number of seconds");
  return s;
}

namespace {
// Runs f on a host tensor, staged through the communicator's device when that is not the host.
template <typename F>
void on_comm_device(Communicator& c, Tensor host, bool copy_in, bool copy_out, F f) {
  if (c.device() == Device::CPU) return f(host);
#ifdef OSPREY_WITH_CUDA
  Storage dev(c.device(), host.dtype, host.shape);
  if (copy_in) cuda::copy(dev.view(), host);
  f(dev.view());
  if (copy_out) cuda::copy(host, dev.view());
#else
  (void)copy_in, (void)copy_out;
  fail("a GPU communicator in a build without CUDA");
#endif
}
}  // namespace

void broadcast_bytes(Communicator& c, std::vector<uint8_t>& bytes, int root) {
  Buffer n(DType::I64, {1});
  n.ptr<int64_t>()[0] = int64_t(bytes.size());
  on_comm_device(c, n, true, true, [&](Tensor t) { c.broadcast(t, root); });
  bytes.resize(size_t(n.ptr<int64_t>()[0]));
  Tensor b{bytes.data(), DType::U8, {int64_t(bytes.size())}, Device::CPU};
  on_comm_device(c, b, c.rank() == root, true, [&](Tensor t) { c.broadcast(t, root); });
}

std::vector<int64_t> all_gather_counts(Communicator& c, const std::vector<int64_t>& counts) {
  const int64_t n = c.size();
  OSPREY_CHECK(int64_t(counts.size()) == n, "one count per rank");
  Buffer in(DType::I64, {n}), out(DType::I64, {n * n});
  std::copy(counts.begin(), counts.end(), in.ptr<int64_t>());
  if (c.device() == Device::CPU) {
    c.all_gather(out, in);
  } else {
#ifdef OSPREY_WITH_CUDA
    Storage din(c.device(), DType::I64, {n}), dout(c.device(), DType::I64, {n * n});
    cuda::copy(din.view(), in);
    c.all_gather(dout.view(), din.view());
    cuda::copy(out, dout.view());
#endif
  }
  return std::vector<int64_t>(out.ptr<int64_t>(), out.ptr<int64_t>() + n * n);
}

}  // namespace osprey::dist
