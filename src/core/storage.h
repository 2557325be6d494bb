// Storage: owning memory on either device (a host Buffer, or a DeviceBuffer when the CUDA backend
// is built), for code written once for both backends (the model's caches, workspace and weights).
// Workspace: a per-step bump allocator over one Storage. Tensors taken in a step are released in
// stack order (Workspace::Scope); the arena is sized once and reused, so a steady-state step
// allocates nothing. When a step needs more than the arena holds, the extra comes from separate
// allocations until the next reset(), which replaces the arena with one of the high-water size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace osprey {

class Storage {
 public:
  Storage() = default;
  Storage(Device device, DType dtype, Shape shape);  // uninitialised contents
  Tensor view() const { return view_; }
  operator Tensor() const { return view_; }
  bool empty() const { return view_.data == nullptr; }

 private:
  std::shared_ptr<void> owner_;
  Tensor view_;
};

// A copy of `src` on `device` (the same bytes when it is already there: no copy made then).
Storage to_device_storage(Tensor src, Device device);

class Workspace {
 public:
  explicit Workspace(Device device) : device_(device) {}
  Device device() const { return device_; }
  // Uninitialised contents, 256-byte aligned; valid until released.
  Tensor alloc(DType dtype, Shape shape);
  size_t mark() const { return top_; }
  void release(size_t mark) { top_ = mark; }
  // Start of a step: nothing may be in use. Grows the arena to the high-water mark if it
  // overflowed.
  void reset();
  size_t capacity() const { return capacity_; }
  // Bumped whenever reset() replaces the arena: tensors (and CUDA graphs captured over them) taken
  // before point into freed memory.
  uint64_t generation() const { return generation_; }

  class Scope {
   public:
    explicit Scope(Workspace& w) : w_(w), mark_(w.mark()) {}
    ~Scope() { w_.release(mark_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Workspace& w_;
    size_t mark_;
  };

 private:
  Device device_;
  Storage arena_;
  size_t capacity_ = 0;
  size_t top_ = 0;  // bytes in use (arena and overflow counted alike)
  size_t high_water_ = 0;
  uint64_t generation_ = 0;
  std::vector<Storage> overflow_;
};

}  // namespace osprey
