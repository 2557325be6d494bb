#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace osprey {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  OSPREY_CHECK(dim() >= 1 && begin >= 0 && begin <= end && end <= shape[0], "rows ", begin, "..",
               end, " of ", shape_str(shape));
  Tensor t = *this;
  const int64_t row = numel() / (shape[0] ? shape[0] : 1);
  t.data = static_cast<char*>(data) + size_t(begin * row) * dtype_size(dtype);
  t.shape[0] = end - begin;
  return t;
}

Tensor Tensor::reshape(Shape s) const {
  OSPREY_CHECK(shape_numel(s) == numel(), "reshape ", shape_str(shape), " to ", shape_str(s));
  Tensor t = *this;
  t.shape = std::move(s);
  return t;
}

void Buffer::Free::operator()(void* p) const {
  std::free(p);
}

Buffer::Buffer(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  size_t bytes = size_t(shape_numel(shape_)) * dtype_size(dtype);
  bytes = (bytes + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p)
    fail("out of host memory allocating ", bytes, " bytes for a tensor of shape ",
         shape_str(shape_));
  data_.reset(p);
}

Buffer Buffer::zeros(DType dtype, Shape shape) {
  Buffer b(dtype, std::move(shape));
  std::memset(b.data_.get(), 0, size_t(b.numel()) * dtype_size(dtype));
  return b;
}

}  // namespace osprey
