// Block-scaled fp8 weights (DeepSeek V3's recipe): real = fp8_e4m3 value x scale_inv of the
// block_rows x block_cols block that holds it.
#pragma once

#include <cstdint>

namespace dsinfer {

// w: [rows, cols] e4m3 bytes, row-major. scale_inv: [ceil(rows/block_rows),
// ceil(cols/block_cols)] fp32, row-major. out: [rows, cols] fp32. Edge blocks may be partial.
void dequantize_fp8_block(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols,
                          int block_rows, int block_cols, float* out);

}  // namespace dsinfer
