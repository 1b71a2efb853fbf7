// Each row's 1 / rms for kernels that read a norm's output before it (RowRmsScale,
// cuda_kernels.h), from the partial sums of squares the kernel before wrote: every block of such
// a kernel loads its threads' shares of them with its first loads and finishes the sum at its
// end, so the factor costs it no wait of its own.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/tensor_core.cuh"
#include "backend/cuda/warp_sum.cuh"

namespace dsinfer::cuda {

// The residual's squares of 4 columns, x at i .. i + 3, as a producer adds them for its partial.
__device__ __forceinline__ float squares_of_four(float x0, float x1, float x2, float x3) {
  float s = x0 * x0;
  s = fmaf(x1, x1, s);
  s = fmaf(x2, x2, s);
  return fmaf(x3, x3, s);
}

// Outputs v of 4 columns at element `at` of the rows (a multiple of 4) added to their residual x
// (the fp32 adds of launch_add), times the norm's weight w, and their partial (number
// partial_at = at / 4): what a kernel before a norm left to the products writes
// (ResidualNormOutput).
__device__ __forceinline__ void store_residual_norm(const ResidualNormOutput& r, int64_t at, int64_t partial_at,
                                                    float4 x, float4 w, const float (&v)[4]) {
  x.x += v[0];
  x.y += v[1];
  x.z += v[2];
  x.w += v[3];
  *reinterpret_cast<float4*>(r.x + at) = x;
  const float4 u = make_float4(x.x * w.x, x.y * w.y, x.z * w.z, x.w * w.w);
  *reinterpret_cast<float4*>(r.out + at) = u;
  auto* bf16 = reinterpret_cast<__nv_bfloat162*>(r.out_bf16 + at);
  bf16[0] = __floats2bfloat162_rn(u.x, u.y);
  bf16[1] = __floats2bfloat162_rn(u.z, u.w);
  r.partials[partial_at] = squares_of_four(x.x, x.y, x.z, x.w);
}

// A thread's share of a row's partials (n / 4 of them, n / 16 float4): float4 number threadIdx.x,
// threadIdx.x + kThreads, … in order, each added .x, .y, .z, .w, from zero. The first is copied
// into stage[threadIdx.x] (shared memory, kThreads float4 a row) by cp.async when the kernel
// starts, so that it is in flight through the kernel's work without holding registers
// (cp_async_wait<0>() before rms_share_sum); the others, which only rows wider than kThreads
// × 16 have, are read by rms_share_sum itself.
template <int kThreads>
__device__ __forceinline__ void stage_rms_share(const RowRmsScale& s, int64_t row, float4* stage) {
  const float4* p = reinterpret_cast<const float4*>(s.partials + row * (s.n / 4));
  if (static_cast<int>(threadIdx.x) < s.n / 16) cp_async16(stage + threadIdx.x, p + threadIdx.x, true);
}

// One float4 of partials added to a thread's share, in the order every reader keeps.
__device__ __forceinline__ void add_partials(float& v, float4 f) {
  v += f.x;
  v += f.y;
  v += f.z;
  v += f.w;
}

template <int kThreads, typename RowOf>
__device__ __forceinline__ float rms_share_sum(const RowRmsScale& s, const float4* stage, RowOf row_of) {
  const int n16 = s.n / 16;
  float v = 0.0f;
  if (static_cast<int>(threadIdx.x) < n16) add_partials(v, stage[threadIdx.x]);
  if (n16 > kThreads) {  // rows wider than kThreads × 16: the row's others, by a row that row_of() gives
    const float4* p = reinterpret_cast<const float4*>(s.partials + row_of() * (s.n / 4));
    for (int i = threadIdx.x + kThreads; i < n16; i += kThreads) add_partials(v, p[i]);
  }
  return v;
}

// 1 / sqrt(mean + eps) from the warps' sums of a block, added in warp order. Every kernel that
// applies a row's factor takes it in this order from blocks of the same size, so all of them
// apply the same bits whatever their grid.
template <int kWarps>
__device__ __forceinline__ float rms_scale_of(const float* warp_sums, int stride, const RowRmsScale& s) {
  float total = warp_sums[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) total += warp_sums[w * stride];
  return rsqrtf(total / static_cast<float>(s.n) + s.eps);
}

// Row `row`'s 1 / rms with the bits of a block of kThreads threads (rms_share_sum in each
// thread, then rms_scale_of over the warps), made by one warp: lane l adds the shares of threads
// l, l + 32, … in their orders. Every lane's first loads are issued before any sum waits on them.
template <int kThreads>
__device__ __forceinline__ float rms_scale_by_one_warp(const RowRmsScale& s, int64_t row, int lane) {
  constexpr int kWarps = kThreads / 32;
  const float4* p = reinterpret_cast<const float4*>(s.partials + row * (s.n / 4));
  const int n16 = s.n / 16;
  float4 first[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w)
    first[w] = w * 32 + lane < n16 ? p[w * 32 + lane] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float sums[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    float v = 0.0f;  // adding a thread's missing share as zeros leaves its 0 as rms_share_sum's
    add_partials(v, first[w]);
    // Rows wider than kThreads × 16: the thread's others.
    for (int i = w * 32 + lane + kThreads; i < n16; i += kThreads) add_partials(v, p[i]);
    sums[w] = v;
  }
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sums[w] = warp_sum(sums[w]);
  return rms_scale_of<kWarps>(sums, 1, s);
}

// scales[t] for a t known only at run time, without indexing the register array.
template <int kRows>
__device__ __forceinline__ float scale_of_row(const float (&scales)[kRows], int t) {
  float v = scales[0];
#pragma unroll
  for (int r = 1; r < kRows; ++r)
    if (t == r) v = scales[r];
  return v;
}

}  // namespace dsinfer::cuda
