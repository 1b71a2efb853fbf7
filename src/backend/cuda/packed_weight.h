// The CUDA backend's layout of a linear weight in device memory, one allocation:
//   data     [n_padded, k_padded] bf16 or e4m3, the source rows in packed order (gate/up: each
//            32-row tile holds 16 gate rows, then the same outputs' 16 up rows), zeros beyond
//            the source's rows and columns; 256-byte aligned end;
//   scales   e4m3 only: [n_padded / 16, k_padded / 128] fp32, the scale of each 16 packed rows
//            and 128 columns (the source's block scales; 1 for padding rows); 256-byte end;
//   library  e4m3 only: cuBLASLt's copy of the scales, [ceil(n_padded / 128), scale columns
//            rounded up to 4] 128 × 128 blocks where the packed rows keep the source's blocks
//            (not gate/up, 128-row source blocks), else [k_padded / 128, n_padded], one per
//            packed row and tile.
// pack_weight fills it from host values, make_random_linear on the device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cuda/grouped_gemm.h"
#include "core/host_device.h"

namespace dsinfer::cuda {

// Rows of an e4m3 weight per scale in the packed layout.
constexpr int64_t kPackedScaleRows = 16;

struct PackedWeightLayout {
  int64_t rows = 0, cols = 0;  // the source's (gate/up: both halves, gate rows first)
  int64_t inter = 0;           // gate/up: rows of each half
  bool gate_up = false, fp8 = false;
  int64_t k_padded = 0, n_padded = 0;
  int64_t scale_cols = 0;  // k_padded / 128
  size_t data_bytes = 0, scale_bytes = 0;
  bool library_blocks = false;
  // An e4m3 gate/up from 128-row source blocks whose halves start on one: with its halves one
  // after the other (launch_gate_up_halves), each 128-row block is one source block.
  bool gate_up_halves_blocks = false;
  int64_t library_block_cols = 0, library_scale_count = 0;

  // source_block_rows: rows of the source's FP8 scale blocks (e4m3 only).
  PackedWeightLayout(int64_t source_rows, int64_t source_cols, bool is_gate_up, bool is_fp8, int source_block_rows);
  size_t total_bytes() const { return data_bytes + scale_bytes + library_scale_count * sizeof(float); }

  // Source row of packed row r, or -1 for a row of zero padding.
  DS_HOST_DEVICE int64_t source_row(int64_t r) const {
    if (!gate_up) return r < rows ? r : -1;
    const int64_t tile = r / kGemmTileRows, within = r % kGemmTileRows;
    const int64_t j = tile * kGemmGateUpHalf + within % kGemmGateUpHalf;
    if (j >= inter) return -1;
    return within < kGemmGateUpHalf ? j : inter + j;
  }
};

}  // namespace dsinfer::cuda
