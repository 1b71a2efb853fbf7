// y = x · Wᵀ in fp32 on CUDA cores: the products of the backend's fp32 precision mode
// (DSINFER_CUDA_PRECISION=fp32), where no operand is rounded below fp32. Plain header: usable
// from C++ files without CUDA headers.
//
// Why: the default path rounds every product's activations to bf16 (or e4m3), as every serving
// engine does. On the random test models that decides near-tied logits the other way in about 1
// to 6 of 144 teacher-forced steps; HF transformers in bf16 misses as many. A mode that keeps
// every product in fp32 follows the fp32 reference (the CPU backend) to its rounding, for
// checking a checkpoint or the engine at reference precision. It is not tuned for speed.
//
// The order of an output's sums depends on k alone: k runs in chunks of kGemmF32ChunkK columns,
// each chunk's products added in order from zero, and the chunks' sums added in order. A
// product of few tiles (decode) runs its chunks in thread blocks of their own, whose partial
// sums a second pass adds; one of many tiles runs them one after another in each block. The
// additions are the same either way, so results are batch-invariant.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {

// Rows of x one thread block handles, as the routing's plan counts its row-blocks
// (launch_moe_route_and_plan with rows_per_block = kGemmF32RowsPerBlock).
constexpr int kGemmF32RowsPerBlock = 64;
constexpr int kGemmF32ChunkK = 256;

struct GemmF32Args {
  const float* x = nullptr;           // [*, ldx]
  int64_t ldx = 0;                    // >= k
  const int32_t* src_rows = nullptr;  // [rows] x row of each output row; null: the same row
  // Output rows: y's rows [0, rows), all of them written. Dense form: `weight` [n, k] over them.
  // Grouped form (weight null): the device array `groups` of num_groups weights [n, k], each over
  // rows [row_offsets[g], row_offsets[g + 1]) in row-blocks from block_offsets[g] (both
  // [num_groups + 1], device; row_offsets[num_groups] == rows).
  int64_t rows = 0;
  const float* weight = nullptr;
  const float* const* groups = nullptr;
  const int32_t* row_offsets = nullptr;
  const int32_t* block_offsets = nullptr;
  int num_groups = 0;
  int n = 0;  // outputs (weight rows)
  int k = 0;  // inputs (weight columns, the weight's row stride)
  float* y = nullptr;  // [rows, ldy], columns [0, n) written
  int64_t ldy = 0;
  // The chunks' partial sums where they run in blocks of their own: gemm_f32_workspace_floats.
  float* partials = nullptr;
};

// max_row_blocks: dense, ceil(rows / kGemmF32RowsPerBlock); grouped, an upper bound of the
// row-blocks (blocks past block_offsets[num_groups] return at once).
// The floats of `partials` a launch with these arguments needs (0: none).
int64_t gemm_f32_workspace_floats(const GemmF32Args& args, int64_t max_row_blocks);
void launch_gemm_f32(const GemmF32Args& args, int64_t max_row_blocks, Stream stream);

}  // namespace dsinfer::cuda
