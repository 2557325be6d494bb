// The PNG plot of a serving run: one histogram panel per distribution (TTFT, ITL), with the
// median, p99 and mean marked. A long tail is cut at the 99.5th percentile and counted in the
// panel's legend, so the bulk stays readable.
#pragma once

#include <string>
#include <vector>

#include "bench/canvas.h"

namespace osprey::bench {

struct HistogramPanel {
  std::string title;           // e.g. "TTFT (ms)"
  std::vector<double> values;  // the sample
};

// Draws the panels one above the other.
Canvas plot_histograms(const std::vector<HistogramPanel>& panels);

// Draws and writes a PNG. Throws osprey::Error when the file cannot be written.
void write_histogram_png(const std::string& path, const std::vector<HistogramPanel>& panels);

// Tick spacing for a range: 1, 2 or 5 × 10^k giving about `target` ticks.
double nice_step(double range, int target);

}  // namespace osprey::bench
