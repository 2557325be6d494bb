// DeviceBuffer: owning GPU memory (cudaMalloc; never managed memory), from which Tensor views with
// device CUDA are taken, and the copies between host and device tensors.
// Only built with the CUDA backend (OSPREY_WITH_CUDA); this header needs no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace osprey {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DType dtype, Shape shape);  // uninitialised contents
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  Tensor view() const { return Tensor{data_, dtype_, shape_, Device::CUDA}; }
  operator Tensor() const { return view(); }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return shape_numel(shape_); }
  bool empty() const { return data_ == nullptr; }

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  Shape shape_;
};

namespace cuda {
// Number of CUDA devices usable by this process (0 when there is no GPU or no driver).
int device_count();
// Fails, saying so, when no CUDA device is visible: called before a model is put on the GPU, where
// the first cudaMalloc would otherwise fail with the driver's words ("CUDA driver version is
// insufficient ..."), which do not say that no GPU is there.
void require_device();
// Copies between tensors of equal dtype and element count; each side's device says where it lives.
// Synchronous with respect to the host.
void copy(Tensor dst, Tensor src);
// Fills a device tensor's bytes with `byte` (tests poison outputs with 0xff: NaN in F32 and BF16).
void fill_bytes(Tensor t, int byte);
void synchronize();  // waits for the device; fails with the CUDA error if a kernel faulted
// A device copy of a host tensor.
DeviceBuffer to_device(Tensor host);
// A host copy of a device tensor.
Buffer to_host(Tensor dev);

// The stream the CUDA ops of this thread launch on: the legacy default stream (null) unless a
// StreamScope names another. The legacy stream cannot be captured into a CUDA graph; a capture
// (tests/ops/cuda_graph_util.h, later the decode-step graph runner) runs the ops on its own
// stream through a StreamScope. A cudaStream_t, kept opaque so that this header needs no CUDA.
void* current_stream();
// Sets this thread's stream, returning the previous one (StreamScope's work, for holders that
// cannot keep a scope object: ops::Fork::Side).
void* exchange_current_stream(void* stream);
class StreamScope {
 public:
  explicit StreamScope(void* stream);  // this thread's ops launch on `stream` until destroyed
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  void* previous_;
};
}  // namespace cuda

}  // namespace osprey
