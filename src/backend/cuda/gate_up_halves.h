// cuBLASLt's copy of a packed e4m3 gate/up weight with its halves one after the other
// (gate_up_halves.cu).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/grouped_gemm.h"

namespace dsinfer::cuda {

// dst: cuBLASLt's copy of the packed e4m3 gate/up weight src (gate_up_halves.cu), its gate rows
// [0, n_padded / 2) then its up rows, data e4m3 [n_padded, k_padded] 16-byte aligned, and
// dst_scales its 128 × 128 block scales [n_padded / 128, library_block_cols] (the columns past
// k_padded / 128 zero). For weights whose source blocks are 128 rows (PackedWeightLayout::
// gate_up_halves_blocks).
void launch_gate_up_halves(const GemmWeight& src, void* dst_data, float* dst_scales, int64_t library_block_cols,
                           Stream stream);

}  // namespace dsinfer::cuda
