// Plots for `dsinfer bench-serve`, written as PNG without any plotting library: a small RGB
// canvas with lines, boxes and a built-in 5x7 pixel font, encoded with zlib. Chosen over
// SVG + an external converter so the benchmark needs nothing beyond the build's own libraries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsinfer::cli {

struct PlotSeries {
  std::string label;
  uint32_t rgb = 0;             // 0xRRGGBB
  std::vector<double> values;   // samples; drawn as an empirical CDF
};

struct PlotPanel {
  std::string title;
  std::string x_label;  // unit of the values, e.g. "MS"
  std::vector<PlotSeries> series;
};

// Draws each panel side by side (x: value, y: fraction of samples at or below) and writes the
// PNG. Returns false with a message when the file cannot be written.
bool write_cdf_plot_png(const std::string& path, const std::string& title, const std::vector<PlotPanel>& panels,
                        std::string* error);

}  // namespace dsinfer::cli
