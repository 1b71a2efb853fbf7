// Rotary embedding tables for DeepSeek models, YaRN included, and the attention softmax scale
// (which YaRN's mscale_all_dim adjusts).
#pragma once

#include <vector>

#include "model/model_config.h"

namespace dsinfer {

struct RopeTables {
  int rope_dim = 0;
  int max_positions = 0;
  // [max_positions, rope_dim / 2], the attention factor already folded in.
  std::vector<float> cos;
  std::vector<float> sin;
};

// Inverse frequencies per pair (rope_dim / 2 values), after YaRN blending when configured.
std::vector<double> rope_inv_freq(const ModelConfig& config);
// YaRN's cos/sin multiplier (1 without scaling).
double rope_attention_factor(const ModelConfig& config);
RopeTables make_rope_tables(const ModelConfig& config, int max_positions);
// qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN.
float attention_softmax_scale(const ModelConfig& config);

}  // namespace dsinfer
