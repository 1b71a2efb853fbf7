// DeepSeek's FP8 activations in several terms, for products of a few dozen to a few hundred rows
// whose inputs e4m3's four significant bits round too coarsely: term 0 is the recipe's rows,
// each next term the recipe's rows of what the terms before leave, so two terms hold some eight
// significant bits of each value (bf16's) and three some twelve. cuBLASLt's block-scaled product
// runs over all the terms' rows at once (the weight is read once); their products are then added.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/bf16_store.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/fp8_quantize.cuh"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/vector_load.cuh"

namespace dsinfer::cuda {
namespace {

// v less the values of the tile's codes (four to a word) under `scale`.
__device__ __forceinline__ void subtract_codes(const uint32_t (&words)[2], float scale, float (&v)[8]) {
#pragma unroll
  for (int w = 0; w < 2; ++w)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>((words[w] >> (16 * h)) & 0xffffu);
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      v[4 * w + 2 * h] -= f.x * scale;
      v[4 * w + 2 * h + 1] -= f.y * scale;
    }
}

__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_rows_e4m3_terms_kernel(const __nv_bfloat16* x, int64_t rows, int64_t k, int64_t rows_padded, int terms,
                                    uint8_t* q, float* scales) {
  await_previous_kernels();
  const QuantizePlace at = quantize_place(k);
  const int64_t all_rows = terms * rows_padded;
  float v[kQuantizeRowsPerThread][8];  // padding rows: zeros in every term
  load_quantize_rows(at, rows, [&](int64_t row, float(&values)[8]) { load8(x + row * k + at.col, values); }, v);
  for (int term = 0; term < terms; ++term) {
#pragma unroll
    for (int i = 0; i < kQuantizeRowsPerThread; ++i) {
      const int64_t row = at.row0 + i * kQuantizeRowsAtOnce;
      uint32_t words[2];
      const float scale = quantize_tile_e4m3_words(v[i], words);  // every lane: the tile's shuffles
      if (row < rows_padded) {
        const int64_t out_row = term * rows_padded + row;
        *reinterpret_cast<uint2*>(q + out_row * k + at.col) = make_uint2(words[0], words[1]);
        if (threadIdx.x % kQuantizeLanesPerTile == 0) scales[at.col_tile * all_rows + out_row] = scale;
      }
      subtract_codes(words, scale, v[i]);
    }
  }
}

// out [rows, n] = the sum of the terms' rows of y [terms * rows, n], the last term first (the
// smallest values added first).
template <bool kOutBf16>
__global__ void add_row_terms_kernel(const float* y, int terms, int64_t rows, int64_t n, void* out) {
  await_previous_kernels();
  const int64_t count = rows * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int t = terms - 1; t >= 0; --t) sum += y[t * count + i];
    if constexpr (kOutBf16) static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(sum);
    else static_cast<float*>(out)[i] = sum;
  }
}

}  // namespace

void launch_quantize_rows_e4m3_terms(const uint16_t* x, int64_t rows, int64_t k, int64_t rows_padded, int terms,
                                     uint8_t* q, float* scales, Stream stream) {
  DS_CHECK(k % 128 == 0 && rows_padded >= rows && terms >= 1 && terms <= kMaxFp8ActivationTerms);
  DS_CHECK_MSG(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0,
               "quantize_rows_e4m3_terms: input rows 16-byte aligned and e4m3 rows 8-byte aligned");
  const int64_t num_blocks = quantize_num_blocks(rows_padded, k);
  if (num_blocks == 0) return;
  launch_kernel(quantize_rows_e4m3_terms_kernel, static_cast<unsigned>(num_blocks), kQuantizeThreads, 0, stream,
                reinterpret_cast<const __nv_bfloat16*>(x), rows, k, rows_padded, terms, q, scales);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_add_row_terms(const float* y, int terms, int64_t rows, int64_t n, void* out, bool out_bf16,
                          Stream stream) {
  DS_CHECK(terms >= 1 && rows >= 0 && n >= 0);
  const int64_t count = rows * n;
  if (count == 0) return;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, 4096));
  if (out_bf16) launch_kernel(add_row_terms_kernel<true>, blocks, kThreads, 0, stream, y, terms, rows, n, out);
  else launch_kernel(add_row_terms_kernel<false>, blocks, kThreads, 0, stream, y, terms, rows, n, out);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
