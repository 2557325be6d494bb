// Safetensors reading: one file (memory-mapped) or a sharded checkpoint folder
// (model.safetensors.index.json naming the shard of every tensor).
//
// Every header is checked before any tensor is used: an 8-byte little-endian header length that
// fits the file, a JSON object of {name: {dtype, shape, data_offsets}}, known dtypes, each span
// inside the data region, span length = numel × dtype size, and no two spans overlapping.
// A failure names the file and the tensor.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace osprey {

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  size_t begin = 0;  // offsets into the data region (after the header)
  size_t end = 0;
};

// A safetensors image's header, checked as above against the image's size.
struct SafetensorsHeader {
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  size_t data_offset = 0;  // where the data region starts: 8 + the header length
};

// Parses and checks the header of the `size` bytes at `bytes` (a whole file's image); throws
// osprey::Error naming `path` and the tensor. Reads nothing past bytes + size.
SafetensorsHeader parse_safetensors_header(const unsigned char* bytes, size_t size,
                                           const std::string& path);

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // A read-only view into the mapping (valid while this object lives).
  Tensor tensor(const std::string& name) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  const char* data_ = nullptr;  // start of the data region
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint: a folder with model.safetensors, or with
// model.safetensors.index.json and its shards, or a single .safetensors file.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The tensor; fails naming the tensor (and the checkpoint) when it is absent.
  Tensor get(const std::string& name) const;
  // The tensor, checked to have this shape; fails naming tensor, file, and both shapes.
  Tensor get(const std::string& name, const Shape& shape) const;
  const TensorInfo& info(const std::string& name) const;
  // The file a tensor lives in (for messages).
  const std::string& file_of(const std::string& name) const;
  // Its index among the checkpoint's files (0 for a single file), and how many files there are.
  size_t file_index(const std::string& name) const;
  size_t n_files() const { return files_.size(); }
  std::vector<std::string> names() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index in files_
};

}  // namespace osprey
