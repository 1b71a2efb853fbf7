// The GEMM kernel with 32-row weight tiles (both forms), and the launcher (see grouped_gemm.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <mma.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/tensor_core.cuh"

namespace dsinfer::cuda {
namespace {

using namespace nvcuda;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 4;
// Shared-memory row of a chunk: 32 bf16 + 8 of padding (80 bytes) keeps fragment loads off a
// single bank group while every fragment start stays 32-byte aligned.
constexpr int kLd = kGemmChunkK + 8;
constexpr int kWeightTileBytes = kGemmTileRows * kLd * 2;

template <int kFrags, bool kFp8>
struct Layout {
  static constexpr int kRows = 8 * kFrags;  // rows of x per pass
  // An e4m3 chunk arrives as 32 rows of 32 bytes, unpadded (it is widened in registers).
  static constexpr int kWeightStageBytes = kFp8 ? kGemmTileRows * kGemmChunkK : kWeightTileBytes;
  static constexpr int kXTileBytes = kRows * kLd * 2;
  static constexpr int kStageBytes = kWeightStageBytes + kXTileBytes;
  // Per warp: its pipeline stages. The smaller the block's memory, the more blocks an SM holds:
  // a decode-sized product then runs in one wave.
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kBytes = kWarps * kWarpBytes;
  static constexpr int kReduceBytes = kWarps * kGemmTileRows * kRows * 4;
  static_assert(kReduceBytes <= kBytes, "partial tiles reuse the pipeline's memory");
  static_assert(kStageBytes % 32 == 0 && kWarpBytes % 32 == 0 && kWeightStageBytes % 32 == 0,
                "fragments need 32-byte alignment");
};

// The last split of a tile to finish adds the partial tiles in split order and applies the
// epilogue; it then resets the tile's counter for the next launch.
__device__ void finish_split_tile(const GroupedGemmArgs& a, const GemmWeight& w, int n0, int row_begin, int row_end) {
  __shared__ int s_is_last;
  __threadfence();  // this block's partials are visible before it is counted
  __syncthreads();
  const int tile = blockIdx.y * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) s_is_last = atomicAdd(a.tile_counters + tile, 1) == a.k_splits - 1;
  __syncthreads();
  if (!s_is_last) return;
  __threadfence();
  const int64_t split_stride = static_cast<int64_t>(a.dense_rows) * w.n_padded;
  auto total = [&](int row, int col) {
    const float* p = a.partials + static_cast<int64_t>(row) * w.n_padded + col;
    float v = __ldcg(p);
    for (int s = 1; s < a.k_splits; ++s) v += __ldcg(p + s * split_stride);
    return v;
  };
  const int rows = row_end - row_begin;
  if (a.epilogue == GemmEpilogue::kStoreF32) {
    float* y = static_cast<float*>(a.y);
    for (int idx = threadIdx.x; idx < kGemmTileRows * rows; idx += kThreads) {
      const int r = idx % kGemmTileRows, row = row_begin + idx / kGemmTileRows;
      if (n0 + r < a.n_out) y[static_cast<int64_t>(row) * a.ldy + n0 + r] = total(row, n0 + r);
    }
  } else {
    __nv_bfloat16* y = static_cast<__nv_bfloat16*>(a.y);
    for (int idx = threadIdx.x; idx < kGemmGateUpHalf * rows; idx += kThreads) {
      const int i = idx % kGemmGateUpHalf, row = row_begin + idx / kGemmGateUpHalf;
      const int col = n0 / 2 + i;
      if (col >= a.n_out) continue;
      const float g = total(row, n0 + i), u = total(row, n0 + kGemmGateUpHalf + i);
      y[static_cast<int64_t>(row) * a.ldy + col] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
    }
  }
  if (threadIdx.x == 0) a.tile_counters[tile] = 0;
}

template <int kFrags, bool kFp8>
__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(GroupedGemmArgs a) {
  using L = Layout<kFrags, kFp8>;
  constexpr int kRows = L::kRows;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* warp_smem = smem + warp * L::kWarpBytes;
  const int split = blockIdx.z;

  // A dense product's weight is written by no kernel, and which tile and k range a block takes
  // follows from the launch alone. Its first pipeline stages' weight tiles are therefore
  // requested before this kernel waits for the ones before it: with overlapped launches they
  // stream while those kernels finish (at batch 1 a projection is little more than its weight
  // read). Everything else (x, row lists, partials, counters) is touched after the wait.
  const int n0 = blockIdx.x * kGemmTileRows;
  // The first k chunk of split s of w's k range, and how many chunks of this block's split this
  // warp takes (chunks begin + warp, begin + warp + kWarps, ...).
  auto split_chunk = [&](const GemmWeight& w, int s) { return w.k_padded / kGemmChunkK * s / a.k_splits; };
  auto chunks_of_warp = [&](const GemmWeight& w) {
    const int n = split_chunk(w, split + 1) - split_chunk(w, split);
    return n > warp ? (n - warp + kWarps - 1) / kWarps : 0;
  };
  // The weight tile of this warp's i-th chunk.
  auto issue_weight = [&](const GemmWeight& w, int chunk_begin, int i) {
    unsigned char* stage = warp_smem + (i % kStages) * L::kStageBytes;
    const int k0 = (chunk_begin + warp + i * kWarps) * kGemmChunkK;
    if constexpr (kFp8) {
      const uint8_t* wq = static_cast<const uint8_t*>(w.data);
#pragma unroll
      for (int c = lane; c < kGemmTileRows * 2; c += 32) {
        const int r = c / 2, part = c % 2;
        cp_async16(stage + r * kGemmChunkK + part * 16, wq + static_cast<int64_t>(n0 + r) * w.k_padded + k0 + part * 16,
                   true);
      }
    } else {
      const __nv_bfloat16* wb = static_cast<const __nv_bfloat16*>(w.data);
#pragma unroll
      for (int c = lane; c < kGemmTileRows * 4; c += 32) {
        const int r = c / 4, part = c % 4;
        cp_async16(stage + (r * kLd + part * 8) * 2, wb + static_cast<int64_t>(n0 + r) * w.k_padded + k0 + part * 8,
                   true);
      }
    }
  };
  const bool prefetch = a.groups == nullptr && static_cast<int>(blockIdx.y) * kGemmRowsPerBlock < a.dense_rows &&
                        n0 < a.dense.n_padded;
  if (prefetch) {
    const int n = min(kStages - 1, chunks_of_warp(a.dense));
    for (int i = 0; i < n; ++i) issue_weight(a.dense, split_chunk(a.dense, split), i);
  }
  await_previous_kernels();

  // This block's weight and rows.
  GemmWeight w;
  int row_begin = 0, row_end = 0;
  if (a.groups == nullptr) {
    w = a.dense;
    row_begin = blockIdx.y * kGemmRowsPerBlock;
    if (row_begin >= a.dense_rows) return;
    row_end = min(row_begin + kGemmRowsPerBlock, a.dense_rows);
  } else {
    if (!grouped_row_block(a, blockIdx.y, w, row_begin, row_end)) return;
  }
  if (n0 >= w.n_padded) return;

  const int k_padded = w.k_padded;
  const int chunk_begin = split_chunk(w, split);
  const int my_chunks = chunks_of_warp(w);
  const int scale_cols = (k_padded + kScaleCols - 1) / kScaleCols;
  // e4m3 chunks are widened exactly in registers (mma_e4m3_step), and their block scales
  // multiply each chunk's sums in fp32: scaling before the widening would round every weight to
  // bf16, 2^-9 of its value, and move the product off the checkpoint's weights. The scale
  // depends on the 16-row group of a weight row: acc8[m] holds weight rows 16 m + (g, g + 8)
  // against x rows 8 f + (2t, 2t + 1) of fragment f (the mma's C layout; g = lane / 4, t = lane % 4).
  const int lane_g = lane / 4, lane_t = lane % 4;
  for (int pass_begin = row_begin; pass_begin < row_end; pass_begin += kRows) {
    const int pass_rows = min(kRows, row_end - pass_begin);
    // The x rows this lane copies: rows lane / 4 + 8 f, 16 bytes at (lane % 4) * 8 elements.
    const __nv_bfloat16* x_src[kFrags];
    bool x_valid[kFrags];
#pragma unroll
    for (int f = 0; f < kFrags; ++f) {
      const int t = lane / 4 + 8 * f;
      x_valid[f] = t < pass_rows;
      int64_t row = 0;
      if (x_valid[f]) row = a.src_rows != nullptr ? a.src_rows[pass_begin + t] : pass_begin + t;
      x_src[f] = reinterpret_cast<const __nv_bfloat16*>(a.x) + row * a.ldx + (lane % 4) * 8;
    }

    auto issue_x = [&](int i) {
      unsigned char* x_tile = warp_smem + (i % kStages) * L::kStageBytes + L::kWeightStageBytes;
      const int k0 = (chunk_begin + warp + i * kWarps) * kGemmChunkK;
#pragma unroll
      for (int f = 0; f < kFrags; ++f) {
        const int t = lane / 4 + 8 * f;
        cp_async16(x_tile + (t * kLd + (lane % 4) * 8) * 2, x_src[f] + k0, x_valid[f]);
      }
    };
    auto issue = [&](int i) {
      issue_weight(w, chunk_begin, i);
      issue_x(i);
    };

    WeightRowsAccumulators<kFrags> acc;
#pragma unroll
    for (int f = 0; f < kFrags; ++f) wmma::fill_fragment(acc[f], 0.0f);
    float acc8[2][kFrags][4] = {};

    if (prefetch && pass_begin == row_begin) {
      // The weight tiles of the first stages are in flight already: their x tiles join them,
      // and the first commit takes both.
      start_cp_async_pipeline<kStages>(issue_x, my_chunks);
    } else {
      start_cp_async_pipeline<kStages>(issue, my_chunks);
    }
    for (int i = 0; i < my_chunks; ++i) {
      // Refill the stage consumed one iteration ago; a commit per iteration keeps the group
      // count in step with the chunk index even when there is nothing left to load.
      if (i + kStages - 1 < my_chunks) issue(i + kStages - 1);
      cp_async_commit();
      cp_async_wait<kStages - 1>();
      __syncwarp();
      const unsigned char* stage = warp_smem + (i % kStages) * L::kStageBytes;
      const __nv_bfloat16* x_tile = reinterpret_cast<const __nv_bfloat16*>(stage + L::kWeightStageBytes);
      if constexpr (kFp8) {
        // Lane (g, t) takes columns 8 t .. 8 t + 7 of the chunk: four per step.
        const int k0 = (chunk_begin + warp + i * kWarps) * kGemmChunkK;
        const float scale_lo = w.scales[(n0 / 16) * scale_cols + k0 / kScaleCols];
        const float scale_hi = w.scales[(n0 / 16 + 1) * scale_cols + k0 / kScaleCols];
        uint32_t x_even[2][kFrags], x_odd[2][kFrags];
#pragma unroll
        for (int f = 0; f < kFrags; ++f) {
          const uint4 xw = *reinterpret_cast<const uint4*>(x_tile + (8 * f + lane_g) * kLd + 8 * lane_t);
          pair_x_words(xw.x, xw.y, x_even[0][f], x_odd[0][f]);
          pair_x_words(xw.z, xw.w, x_even[1][f], x_odd[1][f]);
        }
        // The chunk lies in one 128-column scale block: its sums, scaled per 16-row group.
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const uint2 lo = *reinterpret_cast<const uint2*>(stage + (16 * m + lane_g) * kGemmChunkK + 8 * lane_t);
          const uint2 hi = *reinterpret_cast<const uint2*>(stage + (16 * m + lane_g + 8) * kGemmChunkK + 8 * lane_t);
          float chunk[kFrags][4] = {};
          mma_e4m3_step<kFrags>(chunk, lo.x, hi.x, x_even[0], x_odd[0]);
          mma_e4m3_step<kFrags>(chunk, lo.y, hi.y, x_even[1], x_odd[1]);
          const float scale = m == 0 ? scale_lo : scale_hi;
#pragma unroll
          for (int f = 0; f < kFrags; ++f)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc8[m][f][e] += chunk[f][e] * scale;
        }
      } else {
        const __nv_bfloat16* w_tile = reinterpret_cast<const __nv_bfloat16*>(stage);
#pragma unroll
        for (int kk = 0; kk < kGemmChunkK; kk += 16) mma_k16_step<kFrags>(acc, w_tile + kk, x_tile + kk, kLd);
      }
      __syncwarp();  // the stage is refilled next iteration
    }

    // Partial tiles [warp][32 weight rows][kRows x rows] in the pipeline's memory, summed in warp order.
    __syncthreads();
    float* partial = reinterpret_cast<float*>(smem);
    constexpr int kWarpStride = kGemmTileRows * kRows;
    if constexpr (kFp8) {
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int f = 0; f < kFrags; ++f) {
          float* p = partial + warp * kWarpStride + (16 * m + lane_g) * kRows + 8 * f + 2 * lane_t;
          p[0] = acc8[m][f][0];
          p[1] = acc8[m][f][1];
          p[8 * kRows] = acc8[m][f][2];
          p[8 * kRows + 1] = acc8[m][f][3];
        }
    } else {
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
        wmma::store_matrix_sync(partial + warp * kWarpStride + f * 8, acc[f], kRows, wmma::mem_row_major);
    }
    __syncthreads();
    if (a.k_splits > 1) {
      // This split's share of the tile, summed over warps; the epilogue waits for all splits.
      float* part = a.partials + (static_cast<int64_t>(split) * a.dense_rows) * w.n_padded;
      for (int idx = threadIdx.x; idx < kGemmTileRows * kRows; idx += kThreads) {
        const int r = idx % kGemmTileRows, t = idx / kGemmTileRows;
        if (t >= pass_rows) continue;
        float v = partial[r * kRows + t];
#pragma unroll
        for (int q = 1; q < kWarps; ++q) v += partial[q * kWarpStride + r * kRows + t];
        part[static_cast<int64_t>(pass_begin + t) * w.n_padded + n0 + r] = v;
      }
    } else if (a.epilogue == GemmEpilogue::kStoreF32) {
      float* y = static_cast<float*>(a.y);
      for (int idx = threadIdx.x; idx < kGemmTileRows * kRows; idx += kThreads) {
        const int r = idx % kGemmTileRows, t = idx / kGemmTileRows;
        if (t >= pass_rows || n0 + r >= a.n_out) continue;
        float v = partial[r * kRows + t];
#pragma unroll
        for (int q = 1; q < kWarps; ++q) v += partial[q * kWarpStride + r * kRows + t];
        y[static_cast<int64_t>(pass_begin + t) * a.ldy + n0 + r] = v;
      }
    } else {
      __nv_bfloat16* y = static_cast<__nv_bfloat16*>(a.y);
      for (int idx = threadIdx.x; idx < kGemmGateUpHalf * kRows; idx += kThreads) {
        const int i = idx % kGemmGateUpHalf, t = idx / kGemmGateUpHalf;
        const int col = n0 / 2 + i;
        if (t >= pass_rows || col >= a.n_out) continue;
        float g = partial[i * kRows + t], u = partial[(kGemmGateUpHalf + i) * kRows + t];
#pragma unroll
        for (int q = 1; q < kWarps; ++q) {
          g += partial[q * kWarpStride + i * kRows + t];
          u += partial[q * kWarpStride + (kGemmGateUpHalf + i) * kRows + t];
        }
        y[static_cast<int64_t>(pass_begin + t) * a.ldy + col] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
      }
    }
    __syncthreads();  // the next pass refills the pipeline's memory
  }
  if (a.k_splits > 1) finish_split_tile(a, w, n0, row_begin, row_end);
}

template <int kFrags, bool kFp8>
void launch_with(const GroupedGemmArgs& args, dim3 grid, Stream stream) {
  constexpr int bytes = Layout<kFrags, kFp8>::kBytes;
  allow_shared_bytes<grouped_gemm_kernel<kFrags, kFp8>>(bytes);
  launch_kernel(grouped_gemm_kernel<kFrags, kFp8>, grid, kThreads, bytes, stream, args);
  DS_CUDA_CHECK_LAUNCH();
}

// Eight weights per thread (k_padded is a multiple of 128, so a group of eight shares its
// scale): one 8-byte read, one 16-byte write. Prefill-sized MoE layers widen every expert of
// a layer this way, some 550 million weights on V2-Lite.
__global__ void weight_to_bf16_kernel(GemmWeight w, __nv_bfloat16* out) {
  await_previous_kernels();
  const int64_t group = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t i = group * 8;
  if (i >= static_cast<int64_t>(w.n_padded) * w.k_padded) return;
  const int64_t r = i / w.k_padded, c = i % w.k_padded;
  const int scale_cols = (w.k_padded + kScaleCols - 1) / kScaleCols;
  const float scale = w.scales[(r / 16) * scale_cols + c / kScaleCols];
  const uint2 bytes = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(w.data) + i);
  uint4 packed;
  uint32_t* words = reinterpret_cast<uint32_t*>(&packed);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float4 v = widen_e4m3x4(h == 0 ? bytes.x : bytes.y);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x * scale, v.y * scale);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z * scale, v.w * scale);
    words[2 * h] = *reinterpret_cast<const uint32_t*>(&lo);
    words[2 * h + 1] = *reinterpret_cast<const uint32_t*>(&hi);
  }
  *reinterpret_cast<uint4*>(out + i) = packed;
}

}  // namespace

void launch_grouped_gemm(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, int rows_hint,
                         Stream stream) {
  DS_CHECK(max_n_padded % kGemmTileRows == 0 && args.ldx % 8 == 0);
  if (max_n_padded == 0 || max_row_blocks <= 0) return;
  DS_CHECK_MSG(max_row_blocks <= 65535, "grouped GEMM: " << max_row_blocks << " row blocks is beyond the grid");
  DS_CHECK(args.k_splits >= 1 && (args.k_splits == 1 || (args.groups == nullptr && args.partials != nullptr &&
                                                            args.tile_counters != nullptr)));
  DS_CHECK(args.k_splits == 1 || static_cast<int64_t>(max_n_padded / kGemmTileRows) * max_row_blocks <=
                                     kGemmMaxTileCounters);
  DS_CHECK_MSG(args.epilogue != GemmEpilogue::kStoreBf16 ||
                   (args.xq != nullptr && args.rows_per_block == kExpertBlockWideRows),
               "grouped GEMM: bf16 outputs come from the prefill expert blocks only");
  DS_CHECK_MSG(args.epilogue != GemmEpilogue::kSiluMulE4m3 ||
                   (args.xq != nullptr && args.rows_per_block == kExpertBlockWideRows),
               "grouped GEMM: e4m3 SiLU·up rows come from the prefill expert blocks only");
  DS_CHECK_MSG(args.epilogue != GemmEpilogue::kSiluMulF32 && args.x_f32 == nullptr,
               "grouped GEMM: fp32 rows in or SiLU·up rows out are the few-row kernel's");
  DS_CHECK_MSG(args.x_terms == 1 || (args.xq != nullptr && args.rows_per_block != kExpertBlockWideRows),
               "grouped GEMM: e4m3 activations in terms go to the decode-sized expert blocks only");
  if (args.xq != nullptr) {  // e4m3 activations: the wgmma expert blocks (prefill's, or decode's)
    if (args.rows_per_block == kExpertBlockWideRows)
      launch_expert_gemm_prefill(args, max_n_padded, max_row_blocks, stream);
    else
      launch_expert_gemm_fp8_activations(args, max_n_padded, max_row_blocks, rows_hint, stream);
    return;
  }
  if (args.groups != nullptr && args.expert_blocks) {
    if (args.weights_fp8) launch_expert_gemm_fp8(args, max_n_padded, max_row_blocks, rows_hint, stream);
    else launch_expert_gemm(args, max_n_padded, max_row_blocks, rows_hint, stream);
    return;
  }
  const dim3 grid(max_n_padded / kGemmTileRows, max_row_blocks, args.k_splits);
  const bool fp8 = args.weights_fp8;
  // The fragment count follows the rows a group typically has; it never changes the result.
  if (rows_hint <= 8) {
    fp8 ? launch_with<1, true>(args, grid, stream) : launch_with<1, false>(args, grid, stream);
  } else if (rows_hint <= 16) {
    fp8 ? launch_with<2, true>(args, grid, stream) : launch_with<2, false>(args, grid, stream);
  } else {
    fp8 ? launch_with<4, true>(args, grid, stream) : launch_with<4, false>(args, grid, stream);
  }
}

int gemm_k_splits(int n_padded, int k_padded) {
  const int n_tiles = n_padded / kGemmTileRows, num_chunks = k_padded / kGemmChunkK;
  if (n_tiles >= 256) return 1;
  // About 512 blocks, each of whose warps still gets two K chunks or more.
  return std::max(1, std::min({16, 512 / n_tiles, num_chunks / (2 * kWarps)}));
}

void launch_gemm_weight_to_bf16(const GemmWeight& w, uint16_t* out, Stream stream) {
  const int64_t n = static_cast<int64_t>(w.n_padded) * w.k_padded;
  if (n == 0) return;
  DS_CHECK_MSG(w.k_padded % 8 == 0 && reinterpret_cast<uintptr_t>(w.data) % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0,
               "weight widening: rows of 8-element groups and aligned buffers expected");
  const int64_t groups = n / 8;
  launch_kernel(weight_to_bf16_kernel, static_cast<unsigned>((groups + 255) / 256), 256, 0, stream, w,
                reinterpret_cast<__nv_bfloat16*>(out));
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
