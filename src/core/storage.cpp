#include "core/storage.h"

#include <algorithm>

#ifdef OSPREY_WITH_CUDA
#include "core/device_buffer.h"
#endif

namespace osprey {

Storage::Storage(Device device, DType dtype, Shape shape) {
  if (device == Device::CPU) {
    auto b = std::make_shared<Buffer>(dtype, std::move(shape));
    view_ = b->view();
    owner_ = std::move(b);
    return;
  }
#ifdef OSPREY_WITH_CUDA
  auto d = std::make_shared<DeviceBuffer>(dtype, std::move(shape));
  view_ = d->view();
  owner_ = std::move(d);
#else
  fail("a CUDA tensor was asked for, but this build has no CUDA backend");
#endif
}

Storage to_device_storage(Tensor src, Device device) {
  Storage s(device, src.dtype, src.shape);
#ifdef OSPREY_WITH_CUDA
  if (device == Device::CUDA || src.device == Device::CUDA) {
    cuda::copy(s.view(), src);
    return s;
  }
#endif
  OSPREY_CHECK(src.device == Device::CPU && device == Device::CPU, "no CUDA backend");
  std::copy_n(static_cast<const char*>(src.data), src.nbytes(), static_cast<char*>(s.view().data));
  return s;
}

namespace {
constexpr size_t kAlign = 256;
size_t aligned(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

Tensor Workspace::alloc(DType dtype, Shape shape) {
  const size_t bytes = aligned(std::max<size_t>(size_t(shape_numel(shape)) * dtype_size(dtype), 1));
  void* p = nullptr;
  if (top_ + bytes <= capacity_) {
    p = static_cast<char*>(arena_.view().data) + top_;
  } else {
    overflow_.emplace_back(device_, DType::U8, Shape{int64_t(bytes)});
    p = overflow_.back().view().data;
  }
  top_ += bytes;
  high_water_ = std::max(high_water_, top_);
  return Tensor{p, dtype, std::move(shape), device_};
}

void Workspace::reset() {
  top_ = 0;
  if (overflow_.empty()) return;
  overflow_.clear();
  ++generation_;
  arena_ = Storage();
  capacity_ = aligned(high_water_ + high_water_ / 8);
  arena_ = Storage(device_, DType::U8, Shape{int64_t(capacity_)});
}

}  // namespace osprey
