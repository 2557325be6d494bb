#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace osprey {

using nlohmann::json;

namespace {
constexpr size_t kMaxHeader = size_t(100) << 20;  // 100 MB, as the format's reference reader
// Bounds that keep Tensor's int64 arithmetic (numel, strides) exact: no checkpoint comes near.
constexpr size_t kMaxRank = 16;
constexpr uint64_t kMaxElements = uint64_t(1) << 62;
}  // namespace

SafetensorsHeader parse_safetensors_header(const unsigned char* bytes, size_t size,
                                           const std::string& path) {
  if (size < 8)
    fail(path, ": truncated safetensors file (", size,
         " bytes, less than the 8-byte header length)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeader || header_len > size - 8)
    fail(path, ": header length ", header_len, " does not fit the file (", size,
         " bytes): the file is truncated or not safetensors");
  SafetensorsHeader h;
  h.data_offset = 8 + size_t(header_len);
  const size_t data_size = size - h.data_offset;

  json header;
  try {
    header = json::parse(bytes + 8, bytes + h.data_offset);
  } catch (const json::exception& e) {
    fail(path, ": the header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object()) fail(path, ": the header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (v.is_object())
        for (auto m = v.begin(); m != v.end(); ++m)
          if (m.value().is_string()) h.metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    auto bad = [&](const std::string& why) { fail(path, ": tensor '", name, "': ", why); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      bad("header entry needs dtype, shape and data_offsets");
    TensorInfo t;
    t.name = name;
    if (!v["dtype"].is_string() || !dtype_from_name(v["dtype"].get<std::string>(), &t.dtype))
      bad("unknown dtype " + v["dtype"].dump());
    if (!v["shape"].is_array()) bad("shape must be an array");
    if (v["shape"].size() > kMaxRank)
      bad(str_cat("shape ", v["shape"].dump(), " has more than ", kMaxRank, " dimensions"));
    // numel × dtype size must fit the data region; checked per factor so nothing overflows (the
    // product of the non-zero dimensions too: Tensor::numel multiplies them all).
    uint64_t span_bytes = dtype_size(t.dtype), nonzero = 1;
    bool too_big = false;
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned()) bad("shape " + v["shape"].dump() + " has a bad dimension");
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && nonzero > kMaxElements / dim) too_big = true;
      if (!too_big && dim != 0) nonzero *= dim;
      span_bytes = dim == 0 ? 0 : (span_bytes > UINT64_MAX / dim ? UINT64_MAX : span_bytes * dim);
      t.shape.push_back(too_big ? 0 : int64_t(dim));
    }
    if (too_big) bad(str_cat("shape ", v["shape"].dump(), " has more than 2^62 elements"));
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      bad("data_offsets must be [begin, end]");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end) bad("data_offsets begin > end");
    if (end > data_size)
      bad(str_cat("data_offsets [", begin, ", ", end, ") run past the end of the data (", data_size,
                  " bytes): the file is truncated or its header is wrong"));
    t.begin = size_t(begin);
    t.end = size_t(end);
    if (span_bytes != end - begin)
      bad(str_cat(
          "shape ", shape_str(t.shape), " of ", dtype_name(t.dtype), " needs ",
          span_bytes == UINT64_MAX ? std::string("more than 2^64") : std::to_string(span_bytes),
          " bytes but data_offsets span ", end - begin));
    h.tensors[name] = std::move(t);
  }
  std::vector<const TensorInfo*> spans;
  for (const auto& [name, t] : h.tensors) spans.push_back(&t);
  std::sort(spans.begin(), spans.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  // Empty tensors take no bytes and overlap nothing; among the others each must start at or
  // after the furthest end seen so far.
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo* t : spans) {
    if (t->begin == t->end) continue;
    if (furthest && t->begin < furthest->end)
      fail(path, ": tensors '", furthest->name, "' and '", t->name, "' overlap in the data region");
    if (!furthest || t->end > furthest->end) furthest = t;
  }
  return h;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("cannot stat ", path, ": ", std::strerror(errno));
  }
  size_ = size_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail(path, ": truncated safetensors file (", size_,
         " bytes, less than the 8-byte header length)");
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail("cannot map ", path, ": ", std::strerror(errno));
  }
  SafetensorsHeader h;
  try {
    h = parse_safetensors_header(static_cast<const unsigned char*>(map_), size_, path);
  } catch (...) {
    ::munmap(map_, size_);  // the destructor does not run for a constructor that throws
    map_ = nullptr;
    throw;
  }
  data_ = static_cast<const char*>(map_) + h.data_offset;
  tensors_ = std::move(h.tensors);
  metadata_ = std::move(h.metadata);
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(path_, ": no tensor '", name, "'");
  const TensorInfo& t = it->second;
  return Tensor{const_cast<char*>(data_ + t.begin), t.dtype, t.shape, Device::CPU};
}

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  std::vector<std::string> shard_paths;
  if (fs::is_directory(p)) {
    const fs::path index = p / "model.safetensors.index.json";
    if (fs::exists(index)) {
      std::ifstream in(index);
      json j;
      try {
        j = json::parse(in);
      } catch (const json::exception& e) {
        fail(index.string(), ": not valid JSON (", e.what(), ")");
      }
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        fail(index.string(), ": needs a weight_map object");
      std::map<std::string, size_t> shard_index;
      std::vector<std::pair<std::string, std::string>> wanted;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string())
          fail(index.string(), ": weight_map['", it.key(), "'] is not a file name");
        const std::string shard = it.value().get<std::string>();
        if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
          fail(index.string(), ": shard name '", shard, "' must be a plain file name");
        if (!shard_index.count(shard)) {
          shard_index[shard] = shard_paths.size();
          shard_paths.push_back((p / shard).string());
        }
        wanted.emplace_back(it.key(), shard);
      }
      for (const auto& s : shard_paths) files_.push_back(std::make_unique<SafetensorsFile>(s));
      for (const auto& [name, shard] : wanted) {
        const size_t i = shard_index[shard];
        if (!files_[i]->contains(name))
          fail(index.string(), " places tensor '", name, "' in ", shard,
               ", which does not hold it");
        where_[name] = i;
      }
      return;
    }
    const fs::path single = p / "model.safetensors";
    if (!fs::exists(single))
      fail(path, ": no model.safetensors or model.safetensors.index.json in this folder");
    shard_paths.push_back(single.string());
  } else {
    shard_paths.push_back(path);
  }
  for (const auto& s : shard_paths) files_.push_back(std::make_unique<SafetensorsFile>(s));
  for (size_t i = 0; i < files_.size(); ++i)
    for (const auto& [name, t] : files_[i]->tensors()) where_[name] = i;
}

Tensor Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail(path_, ": missing tensor '", name, "'");
  return files_[it->second]->tensor(name);
}

Tensor Checkpoint::get(const std::string& name, const Shape& shape) const {
  Tensor t = get(name);
  if (t.shape != shape)
    fail(file_of(name), ": tensor '", name, "' has shape ", shape_str(t.shape), ", expected ",
         shape_str(shape), " from config.json");
  return t;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail(path_, ": missing tensor '", name, "'");
  return files_[it->second]->tensors().at(name);
}

const std::string& Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return path_;
  return files_[it->second]->path();
}

size_t Checkpoint::file_index(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail(path_, ": missing tensor '", name, "'");
  return it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [n, i] : where_) out.push_back(n);
  return out;
}

}  // namespace osprey
