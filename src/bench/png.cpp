#include "bench/png.h"

#include <array>
#include <fstream>

#include "core/error.h"

namespace osprey::bench {
namespace {

constexpr size_t kStoredBlockMax = 65535;  // a stored deflate block holds at most this many bytes

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[n] = c;
  }
  return t;
}

void put_u32_be(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

void chunk(std::vector<uint8_t>& out, const char type[4], std::span<const uint8_t> data) {
  put_u32_be(out, static_cast<uint32_t>(data.size()));
  const size_t type_at = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  put_u32_be(out, crc32(std::span<const uint8_t>(out).subspan(type_at)));
}

}  // namespace

uint32_t crc32(std::span<const uint8_t> bytes, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  uint32_t c = crc ^ 0xFFFFFFFFu;
  for (uint8_t b : bytes) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t adler32(std::span<const uint8_t> bytes) {
  constexpr uint32_t kMod = 65521;
  uint32_t a = 1, b = 0;
  for (uint8_t v : bytes) {
    a = (a + v) % kMod;
    b = (b + a) % kMod;
  }
  return (b << 16) | a;
}

std::vector<uint8_t> encode_png(int width, int height, std::span<const uint8_t> rgb) {
  OSPREY_CHECK(width > 0 && height > 0, "png size ", width, "x", height);
  const size_t row_bytes = size_t(width) * 3;
  OSPREY_CHECK(rgb.size() == row_bytes * size_t(height), "png pixels ", rgb.size());
  // Scanlines, each led by filter type 0 (none).
  std::vector<uint8_t> raw;
  raw.reserve((row_bytes + 1) * size_t(height));
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);
    const auto row = rgb.subspan(size_t(y) * row_bytes, row_bytes);
    raw.insert(raw.end(), row.begin(), row.end());
  }
  // zlib: CMF/FLG (deflate, 32 KiB window, no dictionary; 0x7801 is a multiple of 31), stored
  // blocks (BFINAL bit, BTYPE 00, LEN, ~LEN, bytes), Adler-32 of the raw data.
  std::vector<uint8_t> z = {0x78, 0x01};
  for (size_t at = 0; at < raw.size() || at == 0; at += kStoredBlockMax) {
    const size_t len = std::min(kStoredBlockMax, raw.size() - at);
    const bool last = at + len >= raw.size();
    z.push_back(last ? 1 : 0);
    z.push_back(static_cast<uint8_t>(len));
    z.push_back(static_cast<uint8_t>(len >> 8));
    z.push_back(static_cast<uint8_t>(~len));
    z.push_back(static_cast<uint8_t>(~len >> 8));
    z.insert(z.end(), raw.begin() + std::ptrdiff_t(at), raw.begin() + std::ptrdiff_t(at + len));
    if (last) break;
  }
  put_u32_be(z, adler32(raw));

  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> ihdr;
  put_u32_be(ihdr, static_cast<uint32_t>(width));
  put_u32_be(ihdr, static_cast<uint32_t>(height));
  ihdr.insert(ihdr.end(),
              {8, 2, 0, 0, 0});  // bit depth 8, colour type RGB, deflate, no filter, no interlace
  chunk(out, "IHDR", ihdr);
  chunk(out, "IDAT", z);
  chunk(out, "IEND", {});
  return out;
}

void write_png(const std::string& path, int width, int height, std::span<const uint8_t> rgb) {
  const std::vector<uint8_t> bytes = encode_png(width, height, rgb);
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("cannot write '", path, "'");
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!f) fail("writing '", path, "' failed");
}

}  // namespace osprey::bench
