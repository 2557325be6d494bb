#include "model/dump.h"

#include <cstring>

#include "model/safetensors_writer.h"
#include "ops/tensor_ops.h"

namespace osprey {

void TensorDump::put(const std::string& name, Tensor t) {
  Buffer b(t.dtype, t.shape);
  ops::copy(b.view(), t);  // device tensors come back to the host
  for (auto& [n, buf] : entries_)
    if (n == name) {
      buf = std::move(b);
      return;
    }
  entries_.emplace_back(name, std::move(b));
}

std::optional<Tensor> TensorDump::find(const std::string& name) const {
  for (const auto& [n, buf] : entries_)
    if (n == name) return buf.view();
  return std::nullopt;
}

void TensorDump::save(const std::string& path) const {
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const auto& [n, buf] : entries_) ts.emplace_back(n, buf.view());
  save_safetensors(path, ts);
}

}  // namespace osprey
