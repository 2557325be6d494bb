#include "model/safetensors_writer.h"

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace osprey {

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorDecl> decls,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), decls_(std::move(decls)) {
  nlohmann::ordered_json h;
  if (!metadata.empty()) h["__metadata__"] = metadata;
  size_t off = 0;
  for (const auto& d : decls_) {
    h[d.name] = {{"dtype", std::string(dtype_name(d.dtype))},
                 {"shape", d.shape},
                 {"data_offsets", {off, off + d.nbytes()}}};
    off += d.nbytes();
  }
  std::string header = h.dump();
  while ((8 + header.size()) % 8) header.push_back(' ');  // align the data region to 8 bytes
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) fail("cannot create ", path, ": ", std::strerror(errno));
  unsigned char len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  if (std::fwrite(len, 1, 8, f_) != 8 || std::fwrite(header.data(), 1, n, f_) != n)
    fail("write error on ", path);
}

SafetensorsWriter::~SafetensorsWriter() {
  if (f_) std::fclose(f_);
}

void SafetensorsWriter::write(const std::string& name, const void* data, size_t bytes) {
  while (next_ < decls_.size() && written_ == decls_[next_].nbytes() &&
         decls_[next_].name != name) {
    ++next_;
    written_ = 0;
  }
  OSPREY_CHECK(next_ < decls_.size() && decls_[next_].name == name, "tensor ", name,
               " written out of the declared order in ", path_);
  OSPREY_CHECK(written_ + bytes <= decls_[next_].nbytes(), "too many bytes for ", name);
  if (bytes && std::fwrite(data, 1, bytes, f_) != bytes)
    fail("write error on ", path_, " (disk full?)");
  written_ += bytes;
}

void SafetensorsWriter::finish() {
  while (next_ < decls_.size() && written_ == decls_[next_].nbytes()) {
    ++next_;
    written_ = 0;
  }
  OSPREY_CHECK(next_ == decls_.size(), "tensor ", (next_ < decls_.size() ? decls_[next_].name : ""),
               " not fully written to ", path_);
  if (std::fclose(f_) != 0) {
    f_ = nullptr;
    fail("write error closing ", path_);
  }
  f_ = nullptr;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorDecl> decls;
  for (const auto& [name, t] : tensors) decls.push_back({name, t.dtype, t.shape});
  SafetensorsWriter w(path, decls, metadata);
  for (const auto& [name, t] : tensors) w.write(name, t.data, t.nbytes());
  w.finish();
}

}  // namespace osprey
