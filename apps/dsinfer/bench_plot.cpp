// A minimal raster plotter: canvas, Bresenham lines, 5x7 font, PNG (zlib) encoder.
#include "bench_plot.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

namespace dsinfer::cli {

namespace {

// 5x7 glyphs, one byte per row (low 5 bits, MSB on the left).
struct Glyph {
  char c;
  uint8_t rows[7];
};

const Glyph kFont[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}}, {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}}, {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}}, {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}}, {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}}, {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}}, {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}}, {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}}, {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}}, {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}}, {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}}, {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}},
    {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}}, {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}}, {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}}, {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}},
};

class Canvas {
 public:
  Canvas(int width, int height) : width_(width), height_(height), pixels_(static_cast<size_t>(width * height) * 3, 255) {}
  int width() const { return width_; }
  int height() const { return height_; }

  void set(int x, int y, uint32_t rgb) {
    if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
    size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
    pixels_[i] = static_cast<uint8_t>(rgb >> 16);
    pixels_[i + 1] = static_cast<uint8_t>(rgb >> 8);
    pixels_[i + 2] = static_cast<uint8_t>(rgb);
  }

  void line(int x0, int y0, int x1, int y1, uint32_t rgb, int thickness = 1) {
    int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, err = dx + dy;
    while (true) {
      for (int t = 0; t < thickness; ++t) set(x0, y0 + t, rgb);
      if (x0 == x1 && y0 == y1) break;
      int e2 = 2 * err;
      if (e2 >= dy) { err += dy; x0 += sx; }
      if (e2 <= dx) { err += dx; y0 += sy; }
    }
  }

  // Text at (x, y) top-left, `scale` pixels per font pixel; lowercase is drawn as uppercase.
  void text(int x, int y, const std::string& s, uint32_t rgb, int scale = 2) {
    for (char raw : s) {
      char c = static_cast<char>(std::toupper(static_cast<unsigned char>(raw)));
      for (const auto& g : kFont) {
        if (g.c != c) continue;
        for (int row = 0; row < 7; ++row) {
          for (int col = 0; col < 5; ++col) {
            if (!(g.rows[row] & (0x10 >> col))) continue;
            for (int a = 0; a < scale; ++a)
              for (int b = 0; b < scale; ++b) set(x + col * scale + a, y + row * scale + b, rgb);
          }
        }
      }
      x += 6 * scale;
    }
  }

  bool write_png(const std::string& path, std::string* error) const {
    std::string raw;
    raw.reserve(pixels_.size() + height_);
    for (int y = 0; y < height_; ++y) {
      raw += '\0';  // filter: none
      raw.append(reinterpret_cast<const char*>(&pixels_[static_cast<size_t>(y) * width_ * 3]), static_cast<size_t>(width_) * 3);
    }
    uLongf packed_size = compressBound(raw.size());
    std::string packed(packed_size, '\0');
    if (compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size, reinterpret_cast<const Bytef*>(raw.data()), raw.size(), 9) != Z_OK) {
      *error = "zlib compression failed";
      return false;
    }
    packed.resize(packed_size);
    std::string png("\x89PNG\r\n\x1a\n", 8);
    auto be32 = [](std::string& out, uint32_t v) {
      for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((v >> s) & 0xFF);
    };
    auto chunk = [&](const char* type, const std::string& data) {
      be32(png, static_cast<uint32_t>(data.size()));
      std::string body = std::string(type, 4) + data;
      png += body;
      be32(png, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
    };
    std::string header;
    be32(header, static_cast<uint32_t>(width_));
    be32(header, static_cast<uint32_t>(height_));
    header += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit RGB, no interlace
    chunk("IHDR", header);
    chunk("IDAT", packed);
    chunk("IEND", "");
    std::ofstream out(path, std::ios::binary);
    if (!out || !out.write(png.data(), static_cast<std::streamsize>(png.size()))) {
      *error = "cannot write " + path;
      return false;
    }
    return true;
  }

 private:
  int width_, height_;
  std::vector<uint8_t> pixels_;
};

std::string tick_label(double v) {
  char buf[32];
  if (v == 0) return "0";
  if (std::fabs(v) >= 100) std::snprintf(buf, sizeof(buf), "%.0f", v);
  else if (std::fabs(v) >= 10) std::snprintf(buf, sizeof(buf), "%.1f", v);
  else if (std::fabs(v) >= 1) std::snprintf(buf, sizeof(buf), "%.2f", v);
  else std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

void draw_panel(Canvas& canvas, int left, int top, int width, int height, const PlotPanel& panel) {
  const uint32_t kAxis = 0x333333, kGrid = 0xDDDDDD;
  canvas.text(left, top, panel.title, 0x000000, 2);
  int x0 = left + 50, y0 = top + height - 40, x1 = left + width - 10, y1 = top + 30;
  double max_value = 0;
  for (const auto& s : panel.series)
    for (double v : s.values) max_value = std::max(max_value, v);
  if (max_value <= 0) max_value = 1;
  for (int i = 0; i <= 4; ++i) {
    int y = y0 - (y0 - y1) * i / 4;
    canvas.line(x0, y, x1, y, kGrid);
    canvas.text(left, y - 7, tick_label(i / 4.0), kAxis, 2);
    int x = x0 + (x1 - x0) * i / 4;
    canvas.line(x, y0, x, y1, kGrid);
    canvas.text(x - 12, y0 + 8, tick_label(max_value * i / 4.0), kAxis, 2);
  }
  canvas.line(x0, y0, x1, y0, kAxis);
  canvas.line(x0, y0, x0, y1, kAxis);
  canvas.text(x1 - 6 * 2 * static_cast<int>(panel.x_label.size()), y0 + 24, panel.x_label, kAxis, 2);
  int legend_y = y1 + 4;
  for (const auto& s : panel.series) {
    std::vector<double> v = s.values;
    std::sort(v.begin(), v.end());
    int px = x0, py = y0;
    for (size_t i = 0; i < v.size(); ++i) {
      int x = x0 + static_cast<int>((x1 - x0) * (v[i] / max_value));
      int y = y0 - static_cast<int>((y0 - y1) * (static_cast<double>(i + 1) / v.size()));
      canvas.line(px, py, x, py, s.rgb, 2);
      canvas.line(x, py, x, y, s.rgb, 2);
      px = x;
      py = y;
    }
    canvas.line(x1 - 150, legend_y + 7, x1 - 130, legend_y + 7, s.rgb, 3);
    canvas.text(x1 - 124, legend_y, s.label, s.rgb, 2);
    legend_y += 20;
  }
}

}  // namespace

bool write_cdf_plot_png(const std::string& path, const std::string& title, const std::vector<PlotPanel>& panels,
                        std::string* error) {
  const int kPanelWidth = 520, kPanelHeight = 380;
  Canvas canvas(kPanelWidth * std::max<int>(1, static_cast<int>(panels.size())) + 20, kPanelHeight + 50);
  canvas.text(10, 10, title, 0x000000, 2);
  for (size_t i = 0; i < panels.size(); ++i) {
    draw_panel(canvas, 10 + static_cast<int>(i) * kPanelWidth, 40, kPanelWidth - 20, kPanelHeight, panels[i]);
  }
  return canvas.write_png(path, error);
}

}  // namespace dsinfer::cli
