// A minimal PNG encoder: 8-bit RGB, no filtering, the zlib stream made of "stored" (uncompressed)
// deflate blocks. Plots are small, so size does not matter and no compression library is needed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace osprey::bench {

uint32_t crc32(std::span<const uint8_t> bytes, uint32_t crc = 0);  // PNG / zlib CRC-32
uint32_t adler32(std::span<const uint8_t> bytes);

// rgb: [height, width, 3] row-major. Returns the whole file.
std::vector<uint8_t> encode_png(int width, int height, std::span<const uint8_t> rgb);

// Throws osprey::Error when the file cannot be written.
void write_png(const std::string& path, int width, int height, std::span<const uint8_t> rgb);

}  // namespace osprey::bench
