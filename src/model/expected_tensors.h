// The tensor list a DeepSeek V2/V3 checkpoint must hold for a given config, and the check of
// a Checkpoint against it.
//
// MTP layers (indices num_hidden_layers .. num_hidden_layers + num_nextn_predict_layers - 1)
// are listed as optional: the main model runs without them, and many converted checkpoints
// drop them. They are all-or-nothing per layer: validate_checkpoint() fails when an MTP layer
// is partly present. Their own embed_tokens / shared_head.head copies are optional too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/model_config.h"

namespace dsinfer {

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  // A linear weight: may be stored as F8_E4M3 with "<name>_scale_inv" (F32,
  // [ceil(rows/block_rows), ceil(cols/block_cols)]); otherwise BF16/F16/F32.
  bool quantizable = false;
  bool optional = false;
  int mtp_layer = -1;  // the MTP layer index it belongs to, or -1
};

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

// Shape of the scale_inv tensor of a quantized weight of `shape` ([rows, cols]).
std::vector<int64_t> fp8_scale_shape(const std::vector<int64_t>& shape, const Fp8Quantization& fp8);

// Whether the checkpoint has every tensor of MTP layer `layer` (present and complete).
bool has_mtp_layer(const Checkpoint& ckpt, const ModelConfig& config, int layer);

// Throws Error (kInvalidArgument) naming the directory and listing the first problems (up to
// 20): missing tensors, unexpected tensors, wrong shapes, wrong dtypes, F8_E4M3 weights
// without a well-shaped F32 weight_scale_inv, scale_inv without an fp8 weight, F8_E4M3 weights
// when config.json has no fp8 quantization_config, and (one line each) MTP layers that are only
// partly present. Accepted dtypes: BF16/F16/F32 everywhere, F8_E4M3 for quantizable weights.
void validate_checkpoint(const Checkpoint& ckpt, const ModelConfig& config);

}  // namespace dsinfer
