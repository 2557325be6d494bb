#include "model/npy.h"

#include <cstdio>

#include "core/error.h"

namespace osprey {

void save_npy(const std::string& path, Tensor t) {
  const char* descr = nullptr;
  switch (t.dtype) {
    case DType::F32:
      descr = "<f4";
      break;
    case DType::I32:
      descr = "<i4";
      break;
    case DType::I64:
      descr = "<i8";
      break;
    default:
      fail("save_npy: dtype ", dtype_name(t.dtype), " is not supported");
  }
  std::string shape = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) shape += std::to_string(t.shape[i]) + ",";
  shape += ")";
  std::string header =
      "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64) header.push_back(' ');
  header.push_back('\n');
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("cannot create ", path);
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const uint16_t len = uint16_t(header.size());
  const unsigned char lenb[2] = {uint8_t(len & 0xff), uint8_t(len >> 8)};
  bool ok = std::fwrite(magic, 1, 8, f) == 8 && std::fwrite(lenb, 1, 2, f) == 2 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(t.data, 1, t.nbytes(), f) == t.nbytes();
  ok = std::fclose(f) == 0 && ok;
  if (!ok) fail("write error on ", path);
}

}  // namespace osprey
