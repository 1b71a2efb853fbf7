#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace dsinfer {
namespace {

constexpr double kPi = 3.14159265358979323846;

double yarn_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// The dimension (in rope_dim units) at which a frequency completes `num_rotations` turns over
// the original context.
double correction_dim(double num_rotations, int dim, double base, int original_max_positions) {
  return dim * std::log(original_max_positions / (num_rotations * 2 * kPi)) / (2 * std::log(base));
}

bool is_yarn(const ModelConfig& c) { return c.rope_scaling.type == "yarn"; }

}  // namespace

std::vector<double> rope_inv_freq(const ModelConfig& c) {
  const int dim = c.qk_rope_head_dim;
  const double base = c.rope_theta;
  std::vector<double> inv_freq(dim / 2);
  for (int i = 0; i < dim / 2; ++i) inv_freq[i] = 1.0 / std::pow(base, (2.0 * i) / dim);
  if (!is_yarn(c)) return inv_freq;

  const RopeScaling& s = c.rope_scaling;
  // Blend interpolated (÷factor) and extrapolated frequencies with a linear ramp between the
  // dimensions that turn beta_fast and beta_slow times over the original context.
  double low = std::floor(correction_dim(s.beta_fast, dim, base, s.original_max_position_embeddings));
  double high = std::ceil(correction_dim(s.beta_slow, dim, base, s.original_max_position_embeddings));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < dim / 2; ++i) {
    // fp32 like the reference: the ramp is computed on float32 values.
    const float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
    const double extrapolation_weight = 1.0 - ramp;
    const double extrapolated = inv_freq[i];
    const double interpolated = inv_freq[i] / s.factor;
    inv_freq[i] = interpolated * (1.0 - extrapolation_weight) + extrapolated * extrapolation_weight;
  }
  return inv_freq;
}

double rope_attention_factor(const ModelConfig& c) {
  if (!is_yarn(c)) return 1.0;
  const RopeScaling& s = c.rope_scaling;
  if (s.mscale != 0.0 && s.mscale_all_dim != 0.0)
    return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return yarn_mscale(s.factor, 1.0);
}

RopeTables make_rope_tables(const ModelConfig& c, int max_positions) {
  RopeTables t;
  t.rope_dim = c.qk_rope_head_dim;
  t.max_positions = max_positions;
  const int half = t.rope_dim / 2;
  const std::vector<double> inv_freq = rope_inv_freq(c);
  const double factor = rope_attention_factor(c);
  t.cos.resize(static_cast<size_t>(max_positions) * half);
  t.sin.resize(static_cast<size_t>(max_positions) * half);
  for (int p = 0; p < max_positions; ++p) {
    for (int i = 0; i < half; ++i) {
      // The reference forms the angle in fp32 (float inv_freq × float position).
      const float angle = static_cast<float>(inv_freq[i]) * static_cast<float>(p);
      t.cos[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)) * factor);
      t.sin[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)) * factor);
    }
  }
  return t;
}

float attention_softmax_scale(const ModelConfig& c) {
  double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_head_dim()));
  if (is_yarn(c) && c.rope_scaling.mscale_all_dim != 0.0) {
    const double m = yarn_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

}  // namespace dsinfer
