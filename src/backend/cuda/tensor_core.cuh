// Device helpers shared by the tensor-core kernels: asynchronous global→shared copies
// (cp.async), shared-memory fragment loads (ldmatrix), the bf16, f16 and TF32 tensor-core products
// (mma.sync) and the online-softmax step of a row. Header-only: each kernel file inlines what
// it uses.
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

namespace dsinfer::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory; with valid false they are zero-filled (the source
// address must still be a readable one).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(smem)), "l"(gmem),
               "r"(src_bytes));
}
// The same for 4 bytes (the .cg form, which skips L1, takes 16-byte copies only).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(smem)), "l"(gmem),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending committed groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The start of a cp.async pipeline of kStages stages: issue(s) for the first kStages - 1 of
// num_stages, one commit each whether or not there was a stage to load, so that the group
// count stays in step with the stage index (cp_async_wait<kStages - 2> then waits for the
// oldest stage).
template <int kStages, typename Issue>
__device__ __forceinline__ void start_cp_async_pipeline(Issue& issue, int num_stages) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_stages) issue(s);
    cp_async_commit();
  }
}

// Four 8x8 bf16 matrices: lanes 8i .. 8i+7 give the row addresses of matrix i; register i of
// lane l receives row l/4, columns 2(l%4) and 2(l%4)+1 of matrix i (of its transpose with
// the .trans form).
__device__ __forceinline__ void ldmatrix_x4(const void* row, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(const void* row, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// c [16x8 fp32] += a [16x16 bf16, row-major fragment] · b [16x8 bf16, column fragment].
// Fragments, with g = lane/4 and t = lane%4: a[0] (row g, cols 2t, 2t+1), a[1] (row g+8),
// a[2] (row g, cols 2t+8, 2t+9), a[3] (row g+8, cols 2t+8..); b0 (rows 2t, 2t+1, col g),
// b1 (rows 2t+8, 2t+9); c[0], c[1] (row g, cols 2t, 2t+1), c[2], c[3] (row g+8).
__device__ __forceinline__ void mma_bf16_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same product of f16 operands (the few-row kernel's e4m3 weights, converted exactly).
__device__ __forceinline__ void mma_f16_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c [16x8] += a [16x8] · b [8x8] in TF32. With g = lane/4, t = lane%4: a0 (row g, col t),
// a1 (row g+8, col t), a2 (row g, col t+4), a3 (row g+8, col t+4); b0 (row t, col g), b1 (row
// t+4, col g); c as for the bf16 product.
__device__ __forceinline__ void mma_tf32_16x8x8(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// Moves a row's running softmax state (max of scaled scores, sum of exponentials) to the max
// m_new and adds a chunk's sum; returns the factor that rescales what was accumulated under
// the old max (0 for a row that had seen nothing, whose max is still -FLT_MAX).
__device__ __forceinline__ float advance_softmax_row(float& row_max, float& row_sum, float m_new, float chunk_sum) {
  const float scale = row_max == -FLT_MAX ? 0.0f : expf(row_max - m_new);
  row_sum = row_sum * scale + chunk_sum;
  row_max = m_new;
  return scale;
}

// Two floats as packed bf16, the first in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace dsinfer::cuda
