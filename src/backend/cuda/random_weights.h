// Random linear weights filled on the device (Backend::make_random_linear; random_weights.cu).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/packed_weight.h"

namespace dsinfer::cuda {

// Rows and columns of the source blocks an e4m3 random weight is quantised in (as an FP8
// checkpoint stores its weights).
constexpr int kRandomWeightBlockEdge = 128;

// Source block rows of each half of a gate/up layout: its halves are blocked apart, each from its
// first row (an FP8 checkpoint stores them as two tensors), so a half need not fill whole blocks.
DS_HOST_DEVICE inline int64_t random_weight_blocks_per_half(const PackedWeightLayout& layout) {
  return (layout.inter + kRandomWeightBlockEdge - 1) / kRandomWeightBlockEdge;
}

// Source block rows of an e4m3 layout.
DS_HOST_DEVICE inline int64_t random_weight_block_rows(const PackedWeightLayout& layout) {
  return layout.gate_up ? 2 * random_weight_blocks_per_half(layout)
                        : (layout.rows + kRandomWeightBlockEdge - 1) / kRandomWeightBlockEdge;
}

// The source block row of source row s (stacked: the up's rows after the gate's).
DS_HOST_DEVICE inline int64_t random_weight_source_block(const PackedWeightLayout& layout, int64_t s) {
  if (!layout.gate_up || s < layout.inter) return s / kRandomWeightBlockEdge;
  return random_weight_blocks_per_half(layout) + (s - layout.inter) / kRandomWeightBlockEdge;
}

// Floats of launch_random_packed_weight's block_scales for an e4m3 layout.
inline int64_t random_weight_block_scales(const PackedWeightLayout& layout) {
  return random_weight_block_rows(layout) * layout.scale_cols;
}

// Fills the packed weight at `storage` (layout.total_bytes(), packed_weight.h): source element
// i of tensor t (the gate's and the up's for gate/up, each [layout.inter, cols]; else one
// [rows, cols]) is scale · normal_value(seeds[t], i). e4m3 layouts quantise the values per
// 128 × 128 source block by its largest magnitude; block_scales (fp32,
// random_weight_block_scales floats, e4m3 only) holds those scales between the kernels; a
// gate/up pair in e4m3 stacks halves of whole 16-row scale groups (kPackedScaleRows).
void launch_random_packed_weight(const PackedWeightLayout& layout, uint64_t first_seed, uint64_t second_seed,
                                 float scale, void* storage, float* block_scales, Stream stream);

}  // namespace dsinfer::cuda
