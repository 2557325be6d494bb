// A small RGB raster for plots: rectangles, lines and text in a built-in 5×7 bitmap font
// (digits, A–Z — lower case is drawn as upper case — and . , - + = _ ( ) / : % and space).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace osprey::bench {

struct Rgb {
  uint8_t r, g, b;
};

class Canvas {
 public:
  Canvas(int width, int height, Rgb background);

  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<uint8_t>& pixels() const { return rgb_; }  // [height, width, 3]
  Rgb at(int x, int y) const;

  void set(int x, int y, Rgb c);                          // ignores points outside
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c);  // inclusive corners, any order
  void line(int x0, int y0, int x1, int y1, Rgb c);
  // Text with its top-left corner at (x, y); each font pixel drawn as scale × scale.
  void text(int x, int y, std::string_view s, int scale, Rgb c);
  static int text_width(std::string_view s, int scale);
  static int text_height(int scale);

 private:
  int width_, height_;
  std::vector<uint8_t> rgb_;
};

}  // namespace osprey::bench
