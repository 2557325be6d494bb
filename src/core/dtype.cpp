#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace osprey {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kInfo[] = {
    {DType::F32, "F32", 4},         {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1}, {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},         {DType::I8, "I8", 1},   {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},       {DType::F64, "F64", 8},
};
}  // namespace

size_t dtype_size(DType t) {
  for (const auto& i : kInfo)
    if (i.type == t) return i.size;
  OSPREY_CHECK(false, "unknown dtype");
}

std::string_view dtype_name(DType t) {
  for (const auto& i : kInfo)
    if (i.type == t) return i.name;
  OSPREY_CHECK(false, "unknown dtype");
}

bool dtype_from_name(std::string_view name, DType* out) {
  for (const auto& i : kInfo)
    if (i.name == name) {
      *out = i.type;
      return true;
    }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(man), -24);  // zero or subnormal
    if (sign) f = -f;
    return f;
  }
  uint32_t u;
  if (exp == 31)
    u = sign | 0x7f800000u | (man << 13);
  else
    u = sign | ((exp + 112) << 23) | (man << 13);
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  if (std::isnan(f)) return sign | 0x7e00;
  float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity
  if (a < 6.103515625e-05f) {               // subnormal range: quantum 2^-24
    float q = std::nearbyint(a * 16777216.0f);
    return sign | uint16_t(q);
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // 11 significant bits: round m * 2^11 to nearest even.
  float q = std::nearbyint(m * 2048.0f);
  if (q == 2048.0f) {
    q = 1024.0f;
    e += 1;
  }
  const uint16_t exp = uint16_t(e - 1 + 15);
  return sign | uint16_t(exp << 10) | uint16_t(uint32_t(q) - 1024);
}

float e4m3_to_f32(uint8_t v) {
  const bool neg = v & 0x80;
  const int exp = (v >> 3) & 0xf;
  const int man = v & 0x7;
  float f;
  if (exp == 0xf && man == 0x7)
    f = std::nanf("");
  else if (exp == 0)
    f = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
  else
    f = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  return neg ? -f : f;
}

uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= kE4M3Max) return sign | 0x7e;  // 448
  if (a < std::ldexp(1.0f, -6)) {
    // subnormal: quantum 2^-9
    float q = std::nearbyint(a * 512.0f);
    return sign | uint8_t(q);  // q == 8 encodes 2^-6 exactly as exp=1, man=0
  }
  int e;
  float m = std::frexp(a, &e);  // a = m*2^e, m in [0.5,1): 4 significant bits
  float q = std::nearbyint(m * 16.0f);
  if (q == 16.0f) {
    q = 8.0f;
    e += 1;
  }
  const int exp = e - 1 + 7;
  uint8_t bits = uint8_t((exp << 3) | (int(q) - 8));
  if (bits > 0x7e) bits = 0x7e;
  return sign | bits;
}

}  // namespace osprey
