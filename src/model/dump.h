// A named-intermediate dump: the forward pass copies each stage's output here under a name like
// "layers.3.attn_out" when asked, and save() writes them all as one safetensors file for diffing
// against a reference (tools/ has the transformers side).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace osprey {

class TensorDump {
 public:
  void put(const std::string& name, Tensor t);  // copies the data (host tensors)
  void save(const std::string& path) const;
  std::optional<Tensor> find(const std::string& name) const;
  const std::vector<std::pair<std::string, Buffer>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, Buffer>> entries_;
};

}  // namespace osprey
