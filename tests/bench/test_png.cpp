// The PNG writer: a file any decoder accepts (signature, chunk CRCs, IHDR, a zlib stream that
// inflates to the scanlines with a matching Adler-32), and the plot drawn into it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "bench/canvas.h"
#include "bench/plot.h"
#include "bench/png.h"

namespace osprey::bench {
namespace {

uint32_t be32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

// Inflates a zlib stream of stored blocks only (what the writer makes); fails on anything else.
std::vector<uint8_t> inflate_stored(const std::vector<uint8_t>& z) {
  EXPECT_GE(z.size(), 6u);
  EXPECT_EQ(z[0] & 0x0F, 8);                         // CM = deflate
  EXPECT_EQ((uint32_t(z[0]) << 8 | z[1]) % 31, 0u);  // FCHECK
  std::vector<uint8_t> out;
  size_t at = 2;
  for (bool last = false; !last;) {
    EXPECT_LT(at + 5, z.size());
    if (at + 5 >= z.size()) return {};
    const uint8_t header = z[at];
    last = header & 1;
    EXPECT_EQ((header >> 1) & 3, 0) << "not a stored block";
    const uint16_t len = uint16_t(z[at + 1] | z[at + 2] << 8);
    const uint16_t nlen = uint16_t(z[at + 3] | z[at + 4] << 8);
    EXPECT_EQ(uint16_t(~len), nlen);
    at += 5;
    out.insert(out.end(), z.begin() + std::ptrdiff_t(at), z.begin() + std::ptrdiff_t(at + len));
    at += len;
  }
  EXPECT_EQ(at + 4, z.size());
  EXPECT_EQ(be32(&z[at]), adler32(out));
  return out;
}

struct DecodedPng {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

DecodedPng decode(const std::vector<uint8_t>& f) {
  DecodedPng d;
  const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  EXPECT_EQ(std::memcmp(f.data(), sig, 8), 0);
  std::vector<uint8_t> idat;
  std::vector<std::string> order;
  for (size_t at = 8; at + 12 <= f.size();) {
    const uint32_t len = be32(&f[at]);
    const std::string type(f.begin() + std::ptrdiff_t(at + 4), f.begin() + std::ptrdiff_t(at + 8));
    order.push_back(type);
    const std::span<const uint8_t> typed(&f[at + 4], len + 4);
    EXPECT_EQ(be32(&f[at + 8 + len]), crc32(typed)) << type << " CRC";
    const uint8_t* data = &f[at + 8];
    if (type == "IHDR") {
      d.width = int(be32(data));
      d.height = int(be32(data + 4));
      EXPECT_EQ(data[8], 8);  // bit depth
      EXPECT_EQ(data[9], 2);  // RGB
    } else if (type == "IDAT") {
      idat.insert(idat.end(), data, data + len);
    }
    at += 12 + len;
  }
  EXPECT_EQ(order.front(), "IHDR");
  EXPECT_EQ(order.back(), "IEND");
  const std::vector<uint8_t> raw = inflate_stored(idat);
  const size_t row = size_t(d.width) * 3 + 1;
  EXPECT_EQ(raw.size(), row * size_t(d.height));
  for (int y = 0; y < d.height && raw.size() == row * size_t(d.height); ++y) {
    EXPECT_EQ(raw[size_t(y) * row], 0) << "filter type";
    d.rgb.insert(d.rgb.end(), raw.begin() + std::ptrdiff_t(size_t(y) * row + 1),
                 raw.begin() + std::ptrdiff_t(size_t(y + 1) * row));
  }
  return d;
}

TEST(Png, ChecksumsMatchTheirStandardValues) {
  const std::string s = "123456789";
  const std::span<const uint8_t> b(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  EXPECT_EQ(crc32(b), 0xCBF43926u);  // the CRC-32 check value
  const std::string w = "Wikipedia";
  EXPECT_EQ(adler32({reinterpret_cast<const uint8_t*>(w.data()), w.size()}), 0x11E60398u);
}

TEST(Png, SmallImageRoundTrips) {
  const std::vector<uint8_t> rgb = {255, 0, 0, 0, 255, 0, 0, 0, 255,  // row 0
                                    1,   2, 3, 4, 5,   6, 7, 8, 9};   // row 1
  const DecodedPng d = decode(encode_png(3, 2, rgb));
  EXPECT_EQ(d.width, 3);
  EXPECT_EQ(d.height, 2);
  EXPECT_EQ(d.rgb, rgb);
}

TEST(Png, ImageLargerThanOneStoredBlockRoundTrips) {
  const int w = 300, h = 100;  // 90,100 bytes of scanlines: two stored blocks
  std::vector<uint8_t> rgb(size_t(w) * h * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = uint8_t(i * 7 + i / 300);
  const DecodedPng d = decode(encode_png(w, h, rgb));
  EXPECT_EQ(d.rgb, rgb);
}

TEST(Canvas, TextDrawsTheGlyphBitmap) {
  Canvas c(20, 10, {255, 255, 255});
  c.text(1, 1, "1", 1, {0, 0, 0});
  // '1' = 00100 / 01100 / 00100 ... / 01110: column 2 is inked on every row.
  for (int row = 0; row < 7; ++row) EXPECT_EQ(c.at(1 + 2, 1 + row).r, 0) << row;
  EXPECT_EQ(c.at(1 + 0, 1 + 0).r, 255);
  EXPECT_EQ(c.at(1 + 1, 1 + 1).r, 0);  // the serif
  EXPECT_EQ(Canvas::text_width("AB", 2), 22);
}

TEST(Plot, HistogramFileDecodesAndShowsBarsAndMarkers) {
  std::vector<double> ttft, itl;
  for (int i = 0; i < 200; ++i) ttft.push_back(100 + (i % 20));
  for (int i = 0; i < 1000; ++i) itl.push_back(10 + (i % 5));
  itl.push_back(5000);  // a far outlier: cut from the range, counted in the legend
  const auto path = std::filesystem::temp_directory_path() / "osprey_test_plot.png";
  write_histogram_png(path.string(), {{"TTFT (ms)", ttft}, {"ITL (ms)", itl}});
  std::ifstream f(path, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
  const DecodedPng d = decode(bytes);
  EXPECT_EQ(d.width, 1000);
  EXPECT_EQ(d.height, 840);
  size_t bar = 0, p99 = 0, dark = 0;
  for (size_t i = 0; i + 2 < d.rgb.size(); i += 3) {
    bar += d.rgb[i] == 70 && d.rgb[i + 1] == 120 && d.rgb[i + 2] == 200;
    p99 += d.rgb[i] == 210 && d.rgb[i + 1] == 40 && d.rgb[i + 2] == 40;
    dark += d.rgb[i] == 0 && d.rgb[i + 1] == 0 && d.rgb[i + 2] == 0;
  }
  EXPECT_GT(bar, 20000u);  // bars fill a good part of both panels
  EXPECT_GT(p99, 500u);    // the p99 line and its legend
  EXPECT_GT(dark, 3000u);  // axes, ticks, labels
  // With the outlier cut, the ITL bars are not squeezed into one column at the left: the
  // panel's bars span several hundred pixels.
  int min_x = 1000, max_x = 0;
  for (int y = 420; y < 840; ++y)
    for (int x = 0; x < 1000; ++x) {
      const size_t i = (size_t(y) * 1000 + size_t(x)) * 3;
      if (d.rgb[i] == 70 && d.rgb[i + 1] == 120 && d.rgb[i + 2] == 200) {
        min_x = std::min(min_x, x);
        max_x = std::max(max_x, x);
      }
    }
  EXPECT_GT(max_x - min_x, 400);
  std::filesystem::remove(path);
}

TEST(Plot, NiceSteps) {
  EXPECT_DOUBLE_EQ(nice_step(100, 5), 20);
  EXPECT_DOUBLE_EQ(nice_step(7, 8), 1);
  EXPECT_NEAR(nice_step(0.3, 6), 0.05, 1e-15);
}

}  // namespace
}  // namespace osprey::bench
