// libFuzzer target for the safetensors header and reader: the input is a whole file's bytes.
// Any input must either be refused with osprey::Error or give tensors whose spans lie inside the
// data region and hold exactly numel × dtype size bytes; every byte of every tensor is then read
// (AddressSanitizer catches a read past the input). Huge allocations are caught by libFuzzer's
// -malloc_limit_mb (scripts: tests/fuzz_support/run_fuzz.sh).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "model/safetensors.h"

namespace {

[[noreturn]] void die(const char* what, const std::string& tensor) {
  std::fprintf(stderr, "safetensors_fuzz: %s (tensor '%s')\n", what, tensor.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  osprey::SafetensorsHeader h;
  try {
    h = osprey::parse_safetensors_header(data, size, "fuzz.safetensors");
  } catch (const osprey::Error&) {
    return 0;
  }
  if (h.data_offset < 8 || h.data_offset > size) die("data region outside the file", "");
  const size_t data_size = size - h.data_offset;
  volatile uint8_t sink = 0;
  for (const auto& [name, t] : h.tensors) {
    if (t.name != name) die("entry name differs from its key", name);
    if (t.begin > t.end || t.end > data_size) die("span outside the data region", name);
    const osprey::Tensor view{const_cast<uint8_t*>(data + h.data_offset + t.begin), t.dtype,
                              t.shape, osprey::Device::CPU};
    if (view.numel() < 0 || view.nbytes() != t.end - t.begin)
      die("numel x dtype size differs from the span", name);
    const auto* bytes = static_cast<const uint8_t*>(view.data);
    uint8_t x = 0;
    for (size_t i = 0; i < view.nbytes(); ++i) x ^= bytes[i];
    sink = sink ^ x;
  }
  (void)sink;
  return 0;
}
