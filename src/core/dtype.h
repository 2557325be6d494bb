// Element types of tensors in checkpoints and in memory, and scalar conversions between them.
// bf16 and f16 are stored as uint16_t bit patterns; fp8 e4m3 (OCP "e4m3fn": no infinities, max 448,
// 0x7f/0xff are NaN) as uint8_t. ue8m0 is a power-of-two scale: 2^(bits - 127).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace osprey {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, I64, I32, I16, I8, U8, BOOL, F64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: "F32", "BF16", "F8_E4M3", ...
bool dtype_from_name(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

float e4m3_to_f32(uint8_t v);
// Round to nearest even, saturating to ±448 (the convention of DeepSeek's quantizer, which clamps
// before the cast). NaN maps to 0x7f.
uint8_t f32_to_e4m3(float f);

constexpr float kE4M3Max = 448.0f;

// ue8m0 scale: the exponent byte of a power of two.
inline float ue8m0_to_f32(uint8_t e) {
  uint32_t u = uint32_t(e) << 23;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace osprey
