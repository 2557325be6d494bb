// Safetensors writing, streamed: the header (names, dtypes, shapes, offsets) is written first,
// then each tensor's bytes in the declared order, so a checkpoint larger than memory can be made
// one tensor at a time. save_safetensors() writes a set of in-memory tensors in one call.
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace osprey {

struct TensorDecl {
  std::string name;
  DType dtype;
  Shape shape;
  size_t nbytes() const { return size_t(shape_numel(shape)) * dtype_size(dtype); }
};

class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorDecl> decls,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  // The next declared tensor's bytes (exactly its nbytes; may be called in pieces).
  void write(const std::string& name, const void* data, size_t bytes);
  void finish();  // checks that every tensor was written, then closes

 private:
  std::string path_;
  std::vector<TensorDecl> decls_;
  FILE* f_ = nullptr;
  size_t next_ = 0;     // index of the tensor being written
  size_t written_ = 0;  // bytes of it written so far
};

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace osprey
