#include "core/device_buffer.h"

#include <cuda_runtime.h>

#include <utility>

#include "core/error.h"

namespace osprey {

namespace {
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorString(e));
}
}  // namespace

DeviceBuffer::DeviceBuffer(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  size_t bytes = size_t(shape_numel(shape_)) * dtype_size(dtype);
  bytes = (bytes + 255) / 256 * 256;
  if (bytes == 0) bytes = 256;
  const cudaError_t e = cudaMalloc(&data_, bytes);
  if (e == cudaErrorMemoryAllocation)
    fail("out of GPU memory allocating ", bytes, " bytes for a tensor of shape ", shape_str(shape_),
         ": ", cudaGetErrorString(e));
  if (e != cudaSuccess)  // no device, no driver, a device lost: not a matter of memory
    fail("cudaMalloc of ", bytes, " bytes for a tensor of shape ", shape_str(shape_),
         " failed: ", cudaGetErrorString(e));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), dtype_(o.dtype_), shape_(std::move(o.shape_)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(o.data_, nullptr);
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
  }
  return *this;
}

namespace cuda {

namespace {
thread_local void* t_stream = nullptr;  // cudaStream_t of this thread's ops; null: legacy default
}  // namespace

void* current_stream() {
  return t_stream;
}
void* exchange_current_stream(void* stream) {
  return std::exchange(t_stream, stream);
}
StreamScope::StreamScope(void* stream) : previous_(std::exchange(t_stream, stream)) {}
StreamScope::~StreamScope() {
  t_stream = previous_;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

void require_device() {
  if (device_count() == 0)
    fail(
        "--device cuda: no CUDA device is visible (cudaGetDeviceCount found none; check "
        "nvidia-smi and CUDA_VISIBLE_DEVICES), or run with --device cpu");
}

void copy(Tensor dst, Tensor src) {
  OSPREY_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy ", dtype_name(src.dtype),
               shape_str(src.shape), " to ", dtype_name(dst.dtype), shape_str(dst.shape));
  if (src.nbytes() == 0) return;
  const bool d_dev = dst.device == Device::CUDA, s_dev = src.device == Device::CUDA;
  const cudaMemcpyKind kind = d_dev ? (s_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                    : (s_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  check_cuda(cudaMemcpy(dst.data, src.data, src.nbytes(), kind), "cudaMemcpy");
}

void fill_bytes(Tensor t, int byte) {
  OSPREY_CHECK(t.device == Device::CUDA, "fill_bytes on a host tensor");
  check_cuda(cudaMemset(t.data, byte, t.nbytes()), "cudaMemset");
}

void synchronize() {
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

DeviceBuffer to_device(Tensor host) {
  DeviceBuffer d(host.dtype, host.shape);
  copy(d.view(), host);
  return d;
}

Buffer to_host(Tensor dev) {
  Buffer h(dev.dtype, dev.shape);
  copy(h.view(), dev);
  return h;
}

}  // namespace cuda
}  // namespace osprey
