#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"

using namespace osprey;

TEST(DType, E4M3DecodesEveryCodeAndRoundTrips) {
  // Known codes: 0x38 = 1.0, 0x7e = 448, 0x01 = 2^-9 (smallest subnormal), 0x08 = 2^-6.
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float v = e4m3_to_f32(uint8_t(c));
    const uint8_t back = f32_to_e4m3(v);
    if (v == 0.0f)
      EXPECT_EQ(e4m3_to_f32(back), 0.0f);
    else
      EXPECT_EQ(back, uint8_t(c)) << "code " << c;
  }
}

TEST(DType, E4M3RoundsToNearestEvenAndSaturates) {
  // Between 1.0 (0x38) and 1.125 (0x39): 1.0625 is a tie -> even (1.0); 1.07 -> 1.125.
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(f32_to_e4m3(1.07f), 0x39);
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1000.0f), 0xfe);
}

TEST(DType, Bf16AndF16) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is a tie between 1 and 1+2^-7 in bf16: rounds to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  for (uint32_t h = 0; h < 0x7c00; h += 7) EXPECT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h);
}

TEST(DType, Ue8m0) {
  EXPECT_EQ(ue8m0_to_f32(127), 1.0f);
  EXPECT_EQ(ue8m0_to_f32(120), std::ldexp(1.0f, -7));
}
