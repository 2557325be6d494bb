#include "model/dump.h"

#include <cstring>

#include "model/safetensors_writer.h"

namespace osprey {

void TensorDump::put(const std::string& name, Tensor t) {
  OSPREY_CHECK(t.device == Device::CPU, "dump of a device tensor");
  Buffer b(t.dtype, t.shape);
  std::memcpy(b.view().data, t.data, t.nbytes());
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
