// Greedy token choice: the index of each row's largest logit, the lowest index on ties (the CPU
// backend's choose_token is the reference).
//
// A row's best is kept as one 64-bit key: the value's bits in an order that sorts as the floats
// do, then the index counted down, so the larger key is the larger value and, on a tie, the
// lower index. Picking the largest key is then order-free: however the row is cut up and its
// pieces met, the choice is the same. NaN takes the lowest key and so never wins against a
// number.
//
// A step of few rows (a decode step at small batch) cuts each row into slices, one block each:
// one block walking V2's 102,400 logits alone took about 8 µs at batch 1, most of it its
// threads' chains of reads. Each block writes its slice's key to the scratch; the last of the
// row's blocks to arrive (a counter per row, which it sets back to zero) picks among them and
// writes the id. Larger steps take one block per row.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_launch.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSliceLogits = 4096;       // at most this many logits a block when a row is cut up
constexpr int kMaxSlices = 64;
constexpr int64_t kMaxSlicedRows = 32;  // rows of larger steps take one block each
constexpr int kRowThreads = 1024;       // a block's threads when it takes a whole row

__device__ __forceinline__ unsigned long long logit_key(float v, int64_t i) {
  const unsigned bits = __float_as_uint(v);
  unsigned order = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
  if (v != v) order = 0;  // NaN: below every number
  return static_cast<unsigned long long>(order) << 32 | (0xffffffffu - static_cast<unsigned>(i));
}

__device__ __forceinline__ int32_t key_index(unsigned long long key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<unsigned>(key & 0xffffffffu));
}

// The block's largest key (valid in thread 0).
__device__ unsigned long long block_max(unsigned long long key) {
  __shared__ unsigned long long warp_keys[32];
  for (int off = 16; off > 0; off >>= 1) key = max(key, __shfl_xor_sync(0xffffffffu, key, off));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_keys[warp] = key;
  __syncthreads();
  if (warp == 0) {
    key = lane < static_cast<int>(blockDim.x / 32) ? warp_keys[lane] : 0ull;
    for (int off = 16; off > 0; off >>= 1) key = max(key, __shfl_xor_sync(0xffffffffu, key, off));
  }
  return key;
}

// Block (slice, row) takes logits [slice * slice_len, +slice_len) of its row; with one slice
// block x takes row x whole and writes the id itself (rows in x: more than y's 65,535).
// scratch: kMaxSlicedRows counters, then kMaxSlicedRows × kMaxSlices keys.
__global__ void argmax_rows_kernel(const float* x, int64_t n, int num_slices, int64_t slice_len, bool vector_loads,
                                   int32_t* out, unsigned long long* scratch) {
  await_previous_kernels();
  const int64_t row = num_slices == 1 ? blockIdx.x : blockIdx.y;
  const int slice = num_slices == 1 ? 0 : static_cast<int>(blockIdx.x);
  const float* logits = x + row * n;
  const int64_t begin = slice * slice_len, end = min(begin + slice_len, n);
  unsigned long long best = 0;
  if (vector_loads) {  // n and slice_len multiples of 4, rows 16-byte aligned
    for (int64_t i = begin + 4 * threadIdx.x; i < end; i += 4 * blockDim.x) {
      const float4 v = *reinterpret_cast<const float4*>(logits + i);
      best = max(best, max(max(logit_key(v.x, i), logit_key(v.y, i + 1)), max(logit_key(v.z, i + 2),
                                                                               logit_key(v.w, i + 3))));
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) best = max(best, logit_key(logits[i], i));
  }
  best = block_max(best);
  if (threadIdx.x != 0) return;
  if (num_slices == 1) {
    out[row] = key_index(best);
    return;
  }
  unsigned* arrivals = reinterpret_cast<unsigned*>(scratch);
  unsigned long long* keys = scratch + kMaxSlicedRows + row * kMaxSlices;
  keys[slice] = best;
  __threadfence();  // the key is visible before the arrival that may let another block read it
  if (atomicAdd(&arrivals[row], 1u) != static_cast<unsigned>(num_slices - 1)) return;
  __threadfence();
  for (int s = 0; s < num_slices; ++s) best = max(best, __ldcg(keys + s));
  out[row] = key_index(best);
  arrivals[row] = 0;  // ready for the next launch
}

}  // namespace

int64_t argmax_scratch_bytes() {
  return (kMaxSlicedRows + kMaxSlicedRows * kMaxSlices) * static_cast<int64_t>(sizeof(unsigned long long));
}

void launch_argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out, void* scratch, Stream stream) {
  if (rows == 0) return;
  DS_CHECK_MSG(n > 0 && n <= 0x7fffffff && rows <= 0x7fffffff,
               "argmax_rows: " << rows << " rows of " << n << " logits");
  const bool vector_loads = n % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  int64_t num_slices = 1, slice_len = n;
  if (rows <= kMaxSlicedRows && scratch != nullptr) {
    num_slices = std::min<int64_t>(kMaxSlices, (n + kSliceLogits - 1) / kSliceLogits);
    slice_len = ((n + num_slices - 1) / num_slices + 3) / 4 * 4;  // a multiple of 4: whole vectors
    num_slices = (n + slice_len - 1) / slice_len;
  }
  const int threads = num_slices == 1 ? kRowThreads : kThreads;
  const dim3 grid = num_slices == 1 ? dim3(static_cast<unsigned>(rows))
                                    : dim3(static_cast<unsigned>(num_slices), static_cast<unsigned>(rows));
  launch_kernel(argmax_rows_kernel, grid, threads, 0, stream, x, n, static_cast<int>(num_slices), slice_len,
                vector_loads, out, static_cast<unsigned long long*>(scratch));
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
