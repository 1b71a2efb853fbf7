// Device helpers of the grouped GEMM's kernels (grouped_gemm.cu, grouped_gemm_experts.cu,
// few_row_gemm.cu) and of the MoE's chunk layout (cuda_moe.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <mma.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/tensor_core.cuh"

namespace dsinfer::cuda {

// The owner of `index` among num_owners consecutive ranges that start at offsets[0 ..
// num_owners - 1] (non-decreasing, offsets[0] <= index): the last owner whose range starts at
// or before it. Empty ranges share their start with their successor, so the search lands on
// the owner whose range holds the index.
__device__ __forceinline__ int owner_of(const int32_t* offsets, int num_owners, int index) {
  int lo = 0, hi = num_owners - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= index) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The group that owns row-block `block` of a grouped call.
__device__ __forceinline__ int group_of_block(const GroupedGemmArgs& a, int block) {
  return owner_of(a.block_offsets, a.num_groups, block);
}

constexpr int kScaleCols = 128;  // e4m3 scale block width along k

// The weight and the output rows [row_begin, row_end) of row-block `block` of a grouped call
// (at most a.rows_per_block rows of one group); false for a block past the last group's.
__device__ __forceinline__ bool grouped_row_block(const GroupedGemmArgs& a, int block, GemmWeight& w, int& row_begin,
                                                  int& row_end, int* group_out = nullptr) {
  if (block >= a.block_offsets[a.num_groups]) return false;
  const int group = group_of_block(a, block);
  if (group_out != nullptr) *group_out = group;
  w = a.groups[group];
  row_begin = a.row_offsets[group] + (block - a.block_offsets[group]) * a.rows_per_block;
  row_end = min(row_begin + a.rows_per_block, a.row_offsets[group + 1]);
  return true;
}

// grouped_row_block for kernels whose warps call it whole and converged: each lane loads its
// share of the block offsets at once and ballots find the owner, one round of loads instead of
// a binary search's chain of dependent ones (which, at the start of a decode step's expert
// products, is time the weight stream waits for). Up to kWarpSearchGroups groups. The layout is
// read from L2 (ld.cg), so that a kernel may read it before its wait when it was written two
// launches back (GroupedGemmArgs::layout_before_wait): an earlier layer's layout in the same
// buffer may still lie in this SM's L1.
constexpr int kWarpSearchLoads = 9;
constexpr int kWarpSearchGroups = kWarpSearchLoads * 32 - 1;
__device__ __forceinline__ bool grouped_row_block_warp(const GroupedGemmArgs& a, int block, GemmWeight& w,
                                                       int& row_begin, int& row_end, int* group_out = nullptr) {
  if (a.num_groups > kWarpSearchGroups) return grouped_row_block(a, block, w, row_begin, row_end, group_out);
  const int lane = threadIdx.x % 32;
  int32_t offsets[kWarpSearchLoads];
#pragma unroll
  for (int i = 0; i < kWarpSearchLoads; ++i) {
    const int e = i * 32 + lane;
    offsets[i] = e <= a.num_groups ? __ldcg(a.block_offsets + e) : 0;
  }
  // Groups whose first row-block is at or before `block` (the owner is the last of them; the
  // offsets never decrease), and whether the end (offsets[num_groups]) is too.
  int num_started = 0;
  bool past_end = false;
#pragma unroll
  for (int i = 0; i < kWarpSearchLoads; ++i) {
    const int e = i * 32 + lane;
    num_started += __popc(__ballot_sync(0xffffffffu, e < a.num_groups && offsets[i] <= block));
    past_end = past_end || __any_sync(0xffffffffu, e == a.num_groups && offsets[i] <= block);
  }
  if (past_end) return false;
  const int group = num_started - 1;
  if (group_out != nullptr) *group_out = group;
  w = a.groups[group];
  row_begin = __ldcg(a.row_offsets + group) + (block - __ldcg(a.block_offsets + group)) * a.rows_per_block;
  row_end = min(row_begin + a.rows_per_block, __ldcg(a.row_offsets + group + 1));
  return true;
}

// The four e4m3 of a word (the low byte first), widened exactly: every e4m3 value is an f16
// value, and a bf16 one.
__device__ __forceinline__ float4 widen_e4m3x4(uint32_t packed) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(packed & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(packed >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  return make_float4(a.x, a.y, b.x, b.y);
}

// The 128-row expert blocks (grouped_gemm_experts.cu, grouped_gemm_experts_fp8.cu): a block takes
// 128 weight rows of one expert (grid x) and one row-block of its routed rows (grid y); its warps
// take 32 weight rows each.
constexpr int kExpertBlockWeightRows = 128;
struct ExpertBlock {
  GemmWeight w;                    // the expert's weight
  int row_begin = 0, row_end = 0;  // the block's routed rows
  int n_block = 0;                 // its first weight row
  int weight_rows = 0;             // its weight rows within the weight (up to 128)
  int n0 = 0;                      // the calling warp's first weight row
  bool has_tile = false;           // that warp's tile lies within the weight
  // The block at this thread's grid position; false for one with no rows or past its weight.
  __device__ __forceinline__ bool locate(const GroupedGemmArgs& a) {
    if (!grouped_row_block(a, blockIdx.y, w, row_begin, row_end)) return false;
    n_block = blockIdx.x * kExpertBlockWeightRows;
    if (n_block >= w.n_padded) return false;
    n0 = n_block + threadIdx.x / 32 * kGemmTileRows;
    has_tile = n0 < w.n_padded;
    weight_rows = min(kExpertBlockWeightRows, w.n_padded - n_block);
    return true;
  }
};

// Launches an expert-block kernel of `threads` threads with `shared_bytes` of dynamic shared
// memory over its grid: a block per 128 weight rows of the widest weight × max_row_blocks.
template <auto Kernel>
void launch_expert_blocks(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, int threads,
                          int shared_bytes, Stream stream) {
  const dim3 grid((max_n_padded + kExpertBlockWeightRows - 1) / kExpertBlockWeightRows, max_row_blocks);
  allow_shared_bytes<Kernel>(shared_bytes);
  launch_kernel(Kernel, grid, threads, shared_bytes, stream, args);
  DS_CUDA_CHECK_LAUNCH();
}

// The x pieces one thread of a 128-row expert block copies in a pass over the routed rows
// [pass_begin, pass_begin + pass_rows) of its block, from x [*, a.ldx] of element type T (bf16
// a.x, or e4m3 a.xq): piece p = threadIdx.x + j * kThreads is row p / kPiecesPerRow of the pass,
// 16 bytes at piece (p % kPiecesPerRow) of a stage.
template <int kThreads, int kRows, int kPiecesPerRow, typename T = __nv_bfloat16>
struct ExpertPassPieces {
  static constexpr int kPieces = kRows * kPiecesPerRow;
  static constexpr int kPerThread = (kPieces + kThreads - 1) / kThreads;
  static constexpr int kPieceElems = 16 / sizeof(T);
  const T* src[kPerThread];  // the piece in the stage at column 0 (row 0 past the pass)
  bool valid[kPerThread];    // the piece's row is a routed row of the pass
  __device__ __forceinline__ ExpertPassPieces(const T* x, const GroupedGemmArgs& a, int pass_begin, int pass_rows) {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      // Unsigned: the divisions by the power-of-two kPiecesPerRow are shifts.
      const unsigned p = threadIdx.x + j * kThreads, r = p / kPiecesPerRow;
      valid[j] = p < kPieces && static_cast<int>(r) < pass_rows;
      int64_t row = 0;
      if (valid[j]) row = a.src_rows != nullptr ? a.src_rows[pass_begin + r] : pass_begin + r;
      src[j] = x + row * a.ldx + (p % kPiecesPerRow) * kPieceElems;
    }
  }
};

// The epilogue of a warp's finished tile in the 128-row expert blocks: tile [pass_rows][32]
// fp32 in shared memory (routed row t, weight row n0 + i at tile[t * 32 + i]) goes to the
// output rows [pass_begin, pass_begin + pass_rows), as fp32, or as SiLU(gate)·up in bf16.
__device__ __forceinline__ void store_expert_tile(const GroupedGemmArgs& a, const float* tile, int n0,
                                                  int pass_begin, int pass_rows) {
  const int lane = threadIdx.x % 32;
  if (a.epilogue == GemmEpilogue::kStoreF32) {
    float* y = static_cast<float*>(a.y);
    for (int t = 0; t < pass_rows; ++t)
      if (n0 + lane < a.n_out)
        y[static_cast<int64_t>(pass_begin + t) * a.ldy + n0 + lane] = tile[t * kGemmTileRows + lane];
    return;
  }
  __nv_bfloat16* y = static_cast<__nv_bfloat16*>(a.y);
  for (int idx = lane; idx < kGemmGateUpHalf * pass_rows; idx += 32) {
    const int i = idx % kGemmGateUpHalf, t = idx / kGemmGateUpHalf, col = n0 / 2 + i;
    if (col >= a.n_out) continue;
    const float g = tile[t * kGemmTileRows + i], u = tile[t * kGemmTileRows + kGemmGateUpHalf + i];
    y[static_cast<int64_t>(pass_begin + t) * a.ldy + col] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
  }
}

// Word w holds e4m3 columns c0..c3 (c0 in the low byte). Returns the bf16 pairs (c0, c2) in
// `even` and (c1, c3) in `odd`, each with its first column in the low half. An e4m3 byte
// s eeee mmm set into bf16's fields as s 0000eeee mmm0000 reads v · 2⁻¹²⁰, for normal and
// subnormal e4m3 alike; the multiply by 2¹²⁰ is exact (bf16 arithmetic keeps subnormals).
__device__ __forceinline__ void widen_e4m3_word(uint32_t w, uint32_t& even, uint32_t& odd) {
  const uint32_t e = ((w << 4) & 0x07f007f0u) | ((w << 8) & 0x80008000u);
  const uint32_t o = ((w >> 4) & 0x07f007f0u) | (w & 0x80008000u);
  const __nv_bfloat162 two_pow_120 = __halves2bfloat162(__ushort_as_bfloat16(0x7b80), __ushort_as_bfloat16(0x7b80));
  const __nv_bfloat162 ev = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&e), two_pow_120);
  const __nv_bfloat162 ov = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&o), two_pow_120);
  even = *reinterpret_cast<const uint32_t*>(&ev);
  odd = *reinterpret_cast<const uint32_t*>(&ov);
}

// The register-widened e4m3 products (the expert blocks' and the 32-row blocks'): in a 16-column
// tensor-core step, lane (g, t) takes four consecutive columns c0..c3 of weight rows g and g + 8
// (a word each) and the same four of x row g of each fragment. The step's k order pairs (c0, c2)
// and (c1, c3) in both operands, as widen_e4m3_word gives them, so the sums are the product's.
// pair_x_words turns a lane's x words (c0, c1) and (c2, c3) into those pairs.
__device__ __forceinline__ void pair_x_words(uint32_t x01, uint32_t x23, uint32_t& even, uint32_t& odd) {
  even = __byte_perm(x01, x23, 0x5410);
  odd = __byte_perm(x01, x23, 0x7632);
}
template <int kFrags>
__device__ __forceinline__ void mma_e4m3_step(float (&c)[kFrags][4], uint32_t lo, uint32_t hi,
                                              const uint32_t (&x_even)[kFrags], const uint32_t (&x_odd)[kFrags]) {
  uint32_t a[4];
  widen_e4m3_word(lo, a[0], a[2]);
  widen_e4m3_word(hi, a[1], a[3]);
#pragma unroll
  for (int f = 0; f < kFrags; ++f) mma_bf16_16x8x16(c[f], a, x_even[f], x_odd[f]);
}

// A warp's accumulators for its 32 weight rows against kFrags groups of 8 x rows.
template <int kFrags>
using WeightRowsAccumulators = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 32, 8, 16, float>[kFrags];

// One 16-column k step: acc[f] += W · X_fᵀ, with the warp's 32 weight rows at w_tile and the
// x rows at x_tile (group f from row 8 f), both bf16 in shared memory with row stride ld.
template <int kFrags>
__device__ __forceinline__ void mma_k16_step(WeightRowsAccumulators<kFrags>& acc, const __nv_bfloat16* w_tile,
                                             const __nv_bfloat16* x_tile, int ld) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 32, 8, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::load_matrix_sync(fa, w_tile, ld);
#pragma unroll
  for (int f = 0; f < kFrags; ++f) {
    wmma::fragment<wmma::matrix_b, 32, 8, 16, __nv_bfloat16, wmma::col_major> fb;
    wmma::load_matrix_sync(fb, x_tile + f * 8 * ld, ld);
    wmma::mma_sync(acc[f], fa, fb, acc[f]);
  }
}

}  // namespace dsinfer::cuda
