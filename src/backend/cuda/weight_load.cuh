// Weight loads that pass L1 by and carry an L2 eviction policy. A batch-1 step streams over 100 MB
// of weights through the 50 MB L2, each byte read once; under evict-first they stop pushing out
// of L2 what the next launches read again (their code among it).
#pragma once

#include <cstdint>

namespace dsinfer::cuda {

// The L2 policy of a kernel's weight reads: evict-first (GroupedGemmArgs::weights_evict_first,
// the absorbed attention's W_UK and W_UV), or evict-normal.
__device__ __forceinline__ uint64_t weight_l2_policy(bool evict_first) {
  uint64_t policy;
  if (evict_first) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  else asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// 16 bytes of a weight, which no kernel writes and no other block reads: past L1, and through
// L2 under `policy` (weight_l2_policy).
__device__ __forceinline__ uint4 load_weight_piece(const void* p, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

// load_weight_piece where `valid`, zeros where not, as one predicated load into the registers
// it returns. Why not `valid ? load_weight_piece(p) : zeros` in the tensor-core form: there the
// compiler branched around the load and merged the two values in other registers, by moves
// that waited for each load right after it was issued, and the form of two rows took 139
// registers instead of 128 (three blocks an SM instead of four). The CUDA-core forms' selects
// compile to predicated loads already. Where `valid` is false, p need not point anywhere.
__device__ __forceinline__ uint4 load_weight_piece_if(bool valid, const void* p, uint64_t policy) {
  uint4 v;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n"
      " mov.b32 %3, 0;\n @p ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %6;\n}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(static_cast<int>(valid)), "l"(policy));
  return v;
}

}  // namespace dsinfer::cuda
