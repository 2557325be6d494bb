#include "bench/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench/png.h"
#include "bench/stats.h"
#include "core/error.h"

namespace osprey::bench {
namespace {

constexpr int kWidth = 1000, kPanelHeight = 420;
constexpr int kLeft = 90, kRight = 40, kTop = 56, kBottom = 64;  // plot-area margins in a panel
constexpr int kTextScale = 2;
constexpr int kMaxBins = 60, kMinBins = 10;
constexpr double kTailCutPercentile = 99.5;
constexpr double kTailCutRatio = 3.0;  // cut when max > this × the cut percentile
constexpr Rgb kWhite{255, 255, 255}, kBlack{0, 0, 0}, kGrid{225, 225, 225}, kBar{70, 120, 200},
    kMedian{30, 150, 60}, kP99{210, 40, 40}, kMean{230, 140, 0};

std::string tick_label(double v, double step) {
  const int decimals = step >= 1 ? 0 : std::min(6, int(std::ceil(-std::log10(step) - 1e-9)));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, std::abs(v) < step * 1e-6 ? 0.0 : v);
  return buf;
}

std::string fixed(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", std::abs(v) >= 100 ? 0 : std::abs(v) >= 10 ? 1 : 2, v);
  return buf;
}

void draw_panel(Canvas& c, int top, const HistogramPanel& p) {
  const int x0 = kLeft, x1 = kWidth - kRight, y0 = top + kTop, y1 = top + kPanelHeight - kBottom;
  c.text(x0, top + 14, str_cat(p.title, "   N=", p.values.size()), kTextScale, kBlack);
  if (p.values.empty()) {
    c.text(x0 + 20, (y0 + y1) / 2, "NO DATA", kTextScale, kBlack);
    return;
  }
  const Summary s = summarize(p.values, std::vector<double>{99.0, kTailCutPercentile});
  const double p99 = s.percentiles[0];
  double lo = s.min, hi = s.max;
  const bool cut = hi > kTailCutRatio * s.percentiles[1] && s.percentiles[1] > lo;
  if (cut) hi = s.percentiles[1];
  if (hi - lo < 1e-9 * std::max(1.0, std::abs(hi))) {  // one value: give it a visible width
    lo -= std::max(0.5, std::abs(lo) * 0.05);
    hi += std::max(0.5, std::abs(hi) * 0.05);
  }
  const double xstep = nice_step(hi - lo, 8);
  lo = std::floor(lo / xstep) * xstep;
  hi = std::ceil(hi / xstep) * xstep;
  size_t beyond = 0;  // values right of the (cut) range: counted in the legend, not drawn
  if (cut)
    for (double v : p.values) beyond += v > hi;
  const int bins = std::clamp(int(std::sqrt(double(p.values.size())) * 2), kMinBins, kMaxBins);
  std::vector<size_t> counts(size_t(bins), 0);
  for (double v : p.values) {
    if (v > hi) continue;
    const int b = std::clamp(int((v - lo) / (hi - lo) * bins), 0, bins - 1);
    ++counts[size_t(b)];
  }
  const size_t max_count = *std::max_element(counts.begin(), counts.end());
  const double ystep = nice_step(double(std::max<size_t>(max_count, 1)), 5);
  const double ytop = std::max(ystep, std::ceil(double(max_count) / ystep) * ystep);
  const auto px = [&](double v) { return x0 + int(std::lround((v - lo) / (hi - lo) * (x1 - x0))); };
  const auto py = [&](double n) { return y1 - int(std::lround(n / ytop * (y1 - y0))); };

  // Grid and ticks.
  for (double t = 0; t <= ytop + ystep * 1e-6; t += ystep) {
    const int y = py(t);
    c.line(x0, y, x1, y, kGrid);
    const std::string l = tick_label(t, ystep);
    c.line(x0 - 5, y, x0, y, kBlack);
    c.text(x0 - 10 - Canvas::text_width(l, kTextScale), y - Canvas::text_height(kTextScale) / 2, l,
           kTextScale, kBlack);
  }
  for (double t = lo; t <= hi + xstep * 1e-6; t += xstep) {
    const int x = px(t);
    c.line(x, y0, x, y1, kGrid);
    c.line(x, y1, x, y1 + 5, kBlack);
    const std::string l = tick_label(t, xstep);
    c.text(x - Canvas::text_width(l, kTextScale) / 2, y1 + 10, l, kTextScale, kBlack);
  }
  // Bars.
  for (int b = 0; b < bins; ++b) {
    if (!counts[size_t(b)]) continue;
    const int bx0 = x0 + b * (x1 - x0) / bins, bx1 = x0 + (b + 1) * (x1 - x0) / bins - 1;
    c.fill_rect(bx0, py(double(counts[size_t(b)])), std::max(bx0, bx1), y1, kBar);
  }
  // Axes.
  c.line(x0, y0, x0, y1, kBlack);
  c.line(x0, y1, x1, y1, kBlack);
  c.text(x0 - 70, y0 - 24, "COUNT", kTextScale, kBlack);
  // Markers and legend.
  struct Marker {
    const char* name;
    double v;
    Rgb color;
  };
  const Marker markers[] = {
      {"MEDIAN", s.median, kMedian}, {"P99", p99, kP99}, {"MEAN", s.mean, kMean}};
  int lx = x1;
  std::string tail;
  if (beyond) tail = str_cat('+', beyond, " ABOVE ", fixed(hi));
  if (!tail.empty()) {
    lx -= Canvas::text_width(tail, kTextScale);
    c.text(lx, top + 14, tail, kTextScale, kBlack);
    lx -= 24;
  }
  for (int i = 2; i >= 0; --i) {
    const Marker& m = markers[i];
    if (m.v >= lo && m.v <= hi)
      for (int d = 0; d < 2; ++d) c.line(px(m.v) + d, y0, px(m.v) + d, y1, m.color);
    const std::string l = str_cat(m.name, ' ', fixed(m.v));
    lx -= Canvas::text_width(l, kTextScale);
    c.text(lx, top + 14, l, kTextScale, m.color);
    lx -= 24;
  }
}

}  // namespace

double nice_step(double range, int target) {
  if (!(range > 0)) return 1;
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

Canvas plot_histograms(const std::vector<HistogramPanel>& panels) {
  Canvas c(kWidth, kPanelHeight * int(std::max<size_t>(1, panels.size())), kWhite);
  for (size_t i = 0; i < panels.size(); ++i) draw_panel(c, int(i) * kPanelHeight, panels[i]);
  return c;
}

void write_histogram_png(const std::string& path, const std::vector<HistogramPanel>& panels) {
  const Canvas c = plot_histograms(panels);
  write_png(path, c.width(), c.height(), c.pixels());
}

}  // namespace osprey::bench
