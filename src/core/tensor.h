// Tensor: a non-owning view (data, dtype, shape, device), row-major and contiguous.
// Buffer: owning host memory, 64-byte aligned, from which views are taken.
// Op signatures take Tensors so that the CPU and CUDA twins of an op share one signature.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace osprey {

enum class Device : uint8_t { CPU, CUDA };

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3]"

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device device = Device::CPU;

  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int dim() const { return int(shape.size()); }
  // size(-1) is the last dimension.
  int64_t size(int i) const {
    if (i < 0) i += dim();
    OSPREY_CHECK(i >= 0 && i < dim(), "dim ", i, " of ", shape_str(shape));
    return shape[size_t(i)];
  }
  template <typename T>
  T* ptr() const {
    OSPREY_CHECK(sizeof(T) == dtype_size(dtype), "element size of ", dtype_name(dtype));
    return static_cast<T*>(data);
  }
  float* f32() const {
    OSPREY_CHECK(dtype == DType::F32, "expected F32, got ", dtype_name(dtype));
    return static_cast<float*>(data);
  }
  // A view of rows [begin, end) along dimension 0.
  Tensor rows(int64_t begin, int64_t end) const;
  // The same bytes under another shape with the same element count.
  Tensor reshape(Shape s) const;
};

// Owning, 64-byte-aligned host memory.
class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, Shape shape);  // uninitialised contents
  static Buffer zeros(DType dtype, Shape shape);

  Tensor view() const { return Tensor{data_.get(), dtype_, shape_, Device::CPU}; }
  operator Tensor() const { return view(); }
  float* f32() const { return view().f32(); }
  template <typename T>
  T* ptr() const {
    return view().ptr<T>();
  }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return shape_numel(shape_); }
  bool empty() const { return !data_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  DType dtype_ = DType::F32;
  Shape shape_;
};

}  // namespace osprey
