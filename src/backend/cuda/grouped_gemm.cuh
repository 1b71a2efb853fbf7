// Device helpers of the grouped GEMM's two kernels (grouped_gemm.cu, grouped_gemm_experts.cu).
#pragma once

#include "backend/cuda/grouped_gemm.h"

namespace dsinfer::cuda {

// The group that owns row-block `block` of a grouped call: the last group whose first
// row-block is at or before it (empty groups share offsets with their successor, so the
// search lands on the group that owns the block).
__device__ __forceinline__ int group_of_block(const GroupedGemmArgs& a, int block) {
  int lo = 0, hi = a.num_groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.block_offsets[mid] <= block) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace dsinfer::cuda
