// Tensor maps for Hopper's tensor memory accelerator (TMA): descriptors of a 2-D array in global
// memory from which one thread copies whole boxes into shared memory, optionally in the 128-byte
// swizzle that the warpgroup products read. Encoded on the host through the driver's
// cuTensorMapEncodeTiled, found at run time (the backend links the runtime only).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace dsinfer::cuda {

struct TensorMap2d {
  const void* base = nullptr;
  CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  uint64_t inner = 0, outer = 0;  // elements per row, rows
  uint64_t row_bytes = 0;         // a multiple of 16
  uint32_t box_inner = 0, box_outer = 0;
  bool swizzle_128 = false;  // box_inner × element size must then be 128 bytes
};

// Throws Error kUnavailable where the driver lacks the entry point, and on a shape the driver
// refuses (naming it).
CUtensorMap encode_tensor_map(const TensorMap2d& m);

#ifdef __CUDACC__
// Copies the box at element (inner, outer) of `map` (a __grid_constant__ parameter) to shared
// address dst, its bytes counted on the mbarrier at bar (mbarrier_arrive_expect_bytes). Parts of
// the box past the array's ends arrive as zeros.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int inner, int outer, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(bar)
      : "memory");
}
#endif

}  // namespace dsinfer::cuda
