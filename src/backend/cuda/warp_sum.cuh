// A warp's sum of its lanes' values by a xor tree over lane distances 16, 8, 4, 2, 1 (every lane
// gets it): the order the backend's warp reductions share.
#pragma once

namespace dsinfer::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

}  // namespace dsinfer::cuda
