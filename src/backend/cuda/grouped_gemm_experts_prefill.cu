// The prefill expert blocks: the routed experts of a prefill-sized MoE layer in DeepSeek's FP8
// recipe (e4m3 weights with 128 × 128 block scales, e4m3 activations with per-row scales per
// 128 columns), on Hopper's FP8 warpgroup products.
//
// The decode-sized expert blocks (grouped_gemm_experts_wgmma.cu) read 128 weight rows against at
// most 64 routed rows, and every warp both copies and multiplies: each stage ends in a block
// barrier, and its products are waited for before their scales are applied, so the tensor cores
// idle while a warpgroup waits or scales. At prefill sizes (about 1,500 rows per expert on
// V2-Lite) that form ran at about a third of the FP8 rate. Here the warps specialise:
// - a tile is 256 (or 192, or 128) weight rows of one expert against one row-block of 128 of its
//   routed rows (the routing plans row-blocks of kExpertBlockWideRows for these layers); a block
//   per SM takes tile after tile;
// - the first warpgroup only copies: per stage (128 columns of k, one scale block) the row-block's
//   128 e4m3 x rows, the tile's weight rows and their scales, through cp.async into the 128-byte
//   swizzle the products read (256-row tiles: the weight rows by TMA, and the down product's x
//   rows, contiguous per row-block, too); its copies' completion marks the stage full (an
//   mbarrier);
// - two math warpgroups of 64 routed rows each wait for a full stage, run an m64n192 product
//   (or m64n128; two of them one after the other for a 256-row tile) over its 128 columns, mark
//   it empty for the copier, add the sums, scaled by the x rows' and the weight rows' scales, to
//   their totals in registers. The hope was that one warpgroup's products run while the other
//   scales; measured with the copies switched off, products and scaling hardly overlap
//   (RESULTS.md, "Prefill expert blocks");
// - nothing waits on a block-wide barrier after the start.
// What bounds the blocks is data from L2: a 128-row tile brings 128 FLOP per byte, and the math
// warps waited for full stages far more often than the copier waited for empty ones (stall
// sampling, RESULTS.md, the blocks' second pass). Tiles of 192 weight rows bring 154 FLOP per
// byte, of 256 rows 171; their sums take 96 or 128 registers a thread, so the copying warpgroup
// hands registers over, and a 256-row tile's products run in two halves of 128 rows, each added
// to its half of the sums before the next is issued.
// Each math thread then writes its own outputs: fp32 or bf16 rows, or SiLU(gate)·up in bf16,
// since the gate/up interleaving (16 gate rows, then the 16 up rows of a 32-row tile) puts a gate
// column and its up column in the same thread's accumulators. A 256-row gate/up tile's 128
// outputs are one 128-column scale tile of the down product's e4m3 activations, so it writes
// those directly (its four lanes of a row find the row's largest magnitude with two shuffles),
// through rows in shared memory that leave in 16-byte pieces.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/bf16_store.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fp8_quantize.cuh"
#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/tensor_core.cuh"
#include "backend/cuda/tensor_map.h"
#include "backend/cuda/wgmma.cuh"
#include "core/dtype.h"

namespace dsinfer::cuda {
namespace {

constexpr int kStageK = kScaleCols;              // columns per stage: one scale block
constexpr int kRows = kExpertBlockWideRows;      // routed rows per block
constexpr int kGroupRows = 64;                   // routed rows per math warpgroup
constexpr int kMathGroups = kRows / kGroupRows;  // 2
constexpr int kCopyThreads = 128;                // the copying warpgroup
constexpr int kThreads = kCopyThreads + kMathGroups * 128;
constexpr int kPiecesPerRow = kStageK / 16;
constexpr int kRowStep = kCopyThreads / kPiecesPerRow;  // rows apart of one copy thread's pieces
constexpr int kScaleRows = 16;                          // weight rows per scale (GemmWeight)
static_assert(kRows * kPiecesPerRow % kCopyThreads == 0 && kRows == kCopyThreads, "whole pieces per copy thread");

// The blocks for kCols weight rows per tile (the product's n: 128, or 192 for more FLOP per byte
// brought from L2). A stage: x [128 rows][128 bytes] (math warpgroup m reads rows 64 m ..), then
// the weight [kCols rows][128 bytes], both swizzled and 1024-byte aligned, then the x rows'
// scales and the weight's 16-row scales.
template <int kCols>
struct Tiles {
  // A math warpgroup's products run kProductCols weight rows at once: a 256-row tile's sums (128
  // a thread) leave room for one half's products only, so it runs two m64n128 groups a stage,
  // each scaled into its half of the sums before the next is issued.
  static constexpr int kProductCols = kCols > 192 ? kCols / 2 : kCols;
  static constexpr int kProducts = kCols / kProductCols;
  static constexpr int kWeightScales = kCols / kScaleRows;
  static constexpr int kWeightOffset = kRows * kStageK;
  static constexpr int kXScaleOffset = kWeightOffset + kCols * kStageK;
  static constexpr int kWeightScaleOffset = kXScaleOffset + kRows * 4;
  static constexpr int kStageBytes = (kWeightScaleOffset + kWeightScales * 4 + 1023) / 1024 * 1024;
  static constexpr int kStages = kCols == 128 ? 6 : kCols == 192 ? 5 : 4;
  static constexpr int kBarrierOffset = kStages * kStageBytes;  // full[kStages], then empty[kStages]
  // 256-row gate/up tiles stage their e4m3 rows here (kStagingPitch bytes a row, 16 more than
  // a row's 128 so that the eight rows a warp writes at once fall in different banks), then
  // write them out in 16-byte pieces.
  static constexpr int kStagingPitch = kScaleCols + 16;
  static constexpr int kStagingOffset = (kBarrierOffset + 2 * kStages * 8 + 127) / 128 * 128;
  static constexpr int kStagingBytes = kCols == 2 * kScaleCols ? kRows * kStagingPitch : 0;
  static constexpr int kBytes = kStagingOffset + kStagingBytes + 1024;  // and the slack to align the start
  static_assert(kBytes <= 227 * 1024, "one block fits on an SM");
  static_assert(kCols % kRowStep == 0 && kCols % kGemmTileRows == 0, "whole copy rounds and gate/up tiles");
  // At 192 columns a math thread's sums and a stage's products take 192 registers, at 256 (sums
  // 128, a half's products 64) as many: the copying warpgroup gives registers to the math ones
  // (kCopyRegisters, kMathRegisters). At 128 every thread keeps 168.
  static constexpr bool kMoveRegisters = kCols > 128;
};
// setmaxnreg's counts where registers move: the launch gives each of the 384 threads 168, and
// 128 × (168 - 72) = 256 × (216 - 168); the copying path spills below 72 where it copies the
// weight rows itself. With TMA weights it needs 40, and 128 × (168 - 40) = 256 × (232 - 168): at
// 216 the math path of a 256-row tile spilled a value it reloaded every stage.
template <bool kTmaWeights>
constexpr int kCopyRegisters = kTmaWeights ? 40 : 72;
template <bool kTmaWeights>
constexpr int kMathRegisters = kTmaWeights ? 232 : 216;

// One output pair (y 8-byte or 4-byte aligned), or a last single output, in fp32 or bf16.
__device__ __forceinline__ void store_pair(float* y, float v0, float v1) { *reinterpret_cast<float2*>(y) = {v0, v1}; }
__device__ __forceinline__ void store_pair(__nv_bfloat16* y, float v0, float v1) {
  *reinterpret_cast<__nv_bfloat162*>(y) = __floats2bfloat162_rn(v0, v1);
}
__device__ __forceinline__ void store_one(float* y, float v) { *y = v; }
__device__ __forceinline__ void store_one(__nv_bfloat16* y, float v) { *y = __float2bfloat16_rn(v); }

// Routed row `row`'s outputs (half 0: row g, half 1: row g + 8 of acc) as they are, in T, into
// y [rows, ldy]: columns below n_out.
template <typename T, int kCols>
__device__ __forceinline__ void store_row(const GroupedGemmArgs& a, const float (&acc)[kCols / 2], int row, int half,
                                          int n_block, int t) {
  T* y = static_cast<T*>(a.y) + static_cast<int64_t>(row) * a.ldy;
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    const int col = n_block + 8 * j + 2 * t;
    if (col + 1 < a.n_out) {
      store_pair(y + col, acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
    } else if (col < a.n_out) {
      store_one(y + col, acc[4 * j + 2 * half]);
    }
  }
}

// Math warpgroup m's own barrier (named barrier 1 + m, its 128 threads): orders their staging
// rows' writes against the reads that store them.
__device__ __forceinline__ void warpgroup_sync(int m) { asm volatile("bar.sync %0, 128;" ::"r"(1 + m) : "memory"); }

// The math warpgroup's kGroupRows staging rows (128 bytes each, `pitch` apart) to memory in
// 16-byte pieces, eight threads to a row: staging row r to dst + (group_row0 + r) * ld_bytes.
// Rows at or past row_end, and pieces at or past row_pieces of a row's eight, are not written.
__device__ __forceinline__ void store_staged_rows(const unsigned char* staging, int pitch, unsigned char* dst,
                                                  int64_t ld_bytes, int group_row0, int row_end, int row_pieces) {
  const int thread = threadIdx.x % 128;
#pragma unroll
  for (int i = 0; i < kGroupRows * 8 / 128; ++i) {
    const int piece = thread + 128 * i, local_row = piece / 8, row_piece = piece % 8;
    if (group_row0 + local_row >= row_end || row_piece >= row_pieces) continue;
    const uint4 bytes = *reinterpret_cast<const uint4*>(staging + local_row * pitch + 16 * row_piece);
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(group_row0 + local_row) * ld_bytes + 16 * row_piece) = bytes;
  }
}

// SiLU(gate)·up of a 256-row tile, whose 128 outputs are one 128-column scale tile of the down
// product's activations, written as those activations (kSiluMulE4m3): each value rounded to bf16
// as the bf16 epilogue stores it, then the row's tile in e4m3 under its largest magnitude / 448,
// the bits launch_quantize_rows_e4m3 makes of the bf16 rows. The four lanes t of a row hold its
// 128 outputs between them; every lane takes part in the shuffles, rows past row_end are not
// written.
// staging: the math warpgroup's kGroupRows rows in shared memory (Tiles::kStagingPitch apart);
// group_row0: the warpgroup's first routed row (row0 is row row0 - group_row0 of staging); m:
// the warpgroup.
template <int kCols>
__device__ __forceinline__ void store_tile_silu_e4m3(const GroupedGemmArgs& a, const float (&acc)[kCols / 2],
                                                     int row0, int row_end, int n_block, int t,
                                                     unsigned char* staging, int group_row0, int m) {
  static_assert(kCols == 2 * kScaleCols, "a tile's outputs are one scale tile");
  constexpr int kQuads = kCols / kGemmTileRows;  // 32-row gate/up tiles
  constexpr int kPitch = Tiles<kCols>::kStagingPitch;
  const int out_col0 = n_block / 2;
  if (out_col0 >= a.n_out) return;  // uniform over the block
  // The warpgroup's stores of its previous tile have read the staging rows.
  warpgroup_sync(m);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 8 * half;
    float out[kQuads][2][2];
    float amax = 0.0f;
#pragma unroll
    for (int q = 0; q < kQuads; ++q)
#pragma unroll
      for (int jj = 0; jj < 2; ++jj)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int jg = 4 * q + jj, ju = jg + 2;
          const float gate = acc[4 * jg + 2 * half + e], up = acc[4 * ju + 2 * half + e];
          const float v = round_to_bf16(silu_times(gate, up));
          out[q][jj][e] = v;
          amax = fmaxf(amax, fabsf(v));
        }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    if (row >= row_end) continue;
    const float scale = e4m3_block_scale(amax);
    unsigned char* y = staging + (row - group_row0) * kPitch;
    const auto store_codes = [&](auto divide) {
#pragma unroll
      for (int q = 0; q < kQuads; ++q)
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const __nv_fp8x2_storage_t codes = __nv_cvt_float2_to_fp8x2(
              make_float2(divide(out[q][jj][0]), divide(out[q][jj][1])), __NV_SATFINITE, __NV_E4M3);
          *reinterpret_cast<__nv_fp8x2_storage_t*>(y + kGemmGateUpHalf * q + 8 * jj + 2 * t) = codes;
        }
    };
    // The 32 quotients v / scale from one reciprocal (with_e4m3_quotient).
    with_e4m3_quotient(scale, store_codes);
    if (t == 0) a.y_scales[static_cast<int64_t>(out_col0 / kScaleCols) * a.y_scale_rows + row] = scale;
  }
  warpgroup_sync(m);
  static_assert(kScaleCols == 128, "a staging row holds one tile's 128 e4m3 codes");
  store_staged_rows(staging, kPitch, static_cast<unsigned char*>(a.y) + out_col0, a.ldy, group_row0, row_end, 8);
}

// kStoreBf16 rows of a 256-row tile through the same staging rows, a quarter of the tile's
// columns (64 bf16, 128 bytes a row) at a time: each thread's pairs land in shared memory (a
// warp's eight rows in different banks, as for the e4m3 codes), then the warpgroup stores
// whole 16-byte pieces. local_row0: the thread's first routed row in staging; the other
// arguments as for store_tile_silu_e4m3.
template <int kCols>
__device__ __forceinline__ void store_tile_bf16_staged(const GroupedGemmArgs& a, const float (&acc)[kCols / 2],
                                                       int row_end, int n_block, int t, unsigned char* staging,
                                                       int local_row0, int group_row0, int m) {
  static_assert(kCols == 2 * kScaleCols, "four rounds of 64 columns");
  constexpr int kPitch = Tiles<kCols>::kStagingPitch;
  constexpr int kRoundCols = 64;                // bf16 columns a round: 128 bytes of a staging row
  constexpr int kRoundSteps = kRoundCols / 8;   // a thread's 8-column steps j in a round
#pragma unroll
  for (int round = 0; round < kCols / kRoundCols; ++round) {
    const int col0 = n_block + round * kRoundCols;
    if (col0 >= a.n_out) break;  // uniform over the block
    // The warpgroup's stores of the previous round (or tile) have read the staging rows.
    warpgroup_sync(m);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      unsigned char* row = staging + (local_row0 + 8 * half) * kPitch;
#pragma unroll
      for (int jj = 0; jj < kRoundSteps; ++jj) {
        const int j = round * kRoundSteps + jj;
        *reinterpret_cast<__nv_bfloat162*>(row + 2 * (8 * jj + 2 * t)) =
            __floats2bfloat162_rn(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      }
    }
    warpgroup_sync(m);
    // n_out and ldy are multiples of 8 (checked at launch): a piece of 8 columns is in or out whole.
    store_staged_rows(staging, kPitch, reinterpret_cast<unsigned char*>(static_cast<__nv_bfloat16*>(a.y) + col0),
                      2 * a.ldy, group_row0, row_end, min(8, (a.n_out - col0) / 8));
  }
}

// A math thread's outputs of a tile: routed rows `row` and row + 8 (those below row_end) ×
// weight rows n_block + 8 j + 2 t (+ 1), from acc as the kernel lays it out.
template <int kCols>
__device__ __forceinline__ void store_tile(const GroupedGemmArgs& a, const float (&acc)[kCols / 2], int row0,
                                           int row_end, int n_block, int t) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 8 * half;
    if (row >= row_end) continue;
    if (a.epilogue == GemmEpilogue::kStoreF32) {
      store_row<float, kCols>(a, acc, row, half, n_block, t);
    } else if (a.epilogue == GemmEpilogue::kStoreBf16) {
      store_row<__nv_bfloat16, kCols>(a, acc, row, half, n_block, t);
    } else {
      // 32-row tile q: gate columns 8 j + 2 t for j = 4 q, 4 q + 1, their up columns at j + 2.
      __nv_bfloat16* y = static_cast<__nv_bfloat16*>(a.y) + static_cast<int64_t>(row) * a.ldy;
#pragma unroll
      for (int q = 0; q < kCols / kGemmTileRows; ++q)
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int jg = 4 * q + jj, ju = jg + 2;
          const int col = n_block / 2 + kGemmGateUpHalf * q + 8 * jj + 2 * t;
          float out[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) out[e] = silu_times(acc[4 * jg + 2 * half + e], acc[4 * ju + 2 * half + e]);
          if (col + 1 < a.n_out) {
            store_pair(y + col, out[0], out[1]);
          } else if (col < a.n_out) {
            store_one(y + col, out[0]);
          }
        }
    }
  }
}

// The block's tile `tile` of a grouped call: weight rows [n_block, n_block + kCols) of the expert
// of row-block tile / n_tiles, against that row-block's rows; false where the expert's weight
// ends before n_block. The calling warps are whole and converged, and search the layout together
// (one round of loads instead of a binary search's chain of dependent ones, which had every
// warp wait at each tile's start).
template <int kCols>
__device__ __forceinline__ bool locate_tile(const GroupedGemmArgs& a, int tile, int n_tiles, GemmWeight& w,
                                            int& row_begin, int& row_end, int& n_block, int* group = nullptr) {
  if (!grouped_row_block_warp(a, tile / n_tiles, w, row_begin, row_end, group)) return false;
  n_block = tile % n_tiles * kCols;
  return n_block < w.n_padded;
}

// part (+)= x · wᵀ over one k32 step, n = 128 or 192.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_e4m3(float (&part)[64], uint64_t desc_x, uint64_t desc_w) {
  wgmma_m64n128k32_e4m3<kAccumulate>(part, desc_x, desc_w);
}
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_e4m3(float (&part)[96], uint64_t desc_x, uint64_t desc_w) {
  wgmma_m64n192k32_e4m3<kAccumulate>(part, desc_x, desc_w);
}

// A math warpgroup's products `product` of one stage: part = its 64 x rows (at x_offset in the
// stage) · the stage's weight rows [product kProductCols, + kProductCols)ᵀ over the stage's 128
// columns, committed as one group.
// kFence: the stage's x rows landed through cp.async (the generic proxy), which the products
// (the async proxy) read only after a proxy fence; rows copied by TMA need none.
template <int kCols, bool kFence = true>
__device__ __forceinline__ void issue_stage_products(float (&part)[Tiles<kCols>::kProductCols / 2],
                                                     uint32_t stage_addr, int x_offset, int product) {
  using T = Tiles<kCols>;
  if (kFence && product == 0) fence_shared_for_wgmma();
  wgmma_fence();
  const uint64_t desc_x = wgmma_descriptor_sw128(stage_addr + x_offset);
  const uint64_t desc_w =
      wgmma_descriptor_sw128(stage_addr + T::kWeightOffset + product * T::kProductCols * kStageK);
  // A 32-byte k-step advances a descriptor's address field (bytes / 16) by 2.
  wgmma_e4m3<false>(part, desc_x, desc_w);
#pragma unroll
  for (int kk = 1; kk < kStageK / 32; ++kk) wgmma_e4m3<true>(part, desc_x + 2 * kk, desc_w + 2 * kk);
  wgmma_commit();
}

// The scales of a stage's products `product` as a math thread needs them: its x rows'
// (scale_row, + 8) and the weight's per 16 of those products' rows. Read one product group at a
// time: a 256-row tile's sums leave no room for all 16 weight scales beside them.
template <int kCols>
struct ProductScales {
  static constexpr int kWeightScales = Tiles<kCols>::kProductCols / kScaleRows;
  float x0, x1;
  float w[kWeightScales];
};
template <int kCols>
__device__ __forceinline__ ProductScales<kCols> read_product_scales(const unsigned char* stage, int scale_row,
                                                                    int product) {
  using T = Tiles<kCols>;
  using P = ProductScales<kCols>;
  P sc;
  const float* x_scales = reinterpret_cast<const float*>(stage + T::kXScaleOffset) + scale_row;
  sc.x0 = x_scales[0];
  sc.x1 = x_scales[8];
  const float* w_scales = reinterpret_cast<const float*>(stage + T::kWeightScaleOffset) + product * P::kWeightScales;
#pragma unroll
  for (int i = 0; i < P::kWeightScales; ++i) sc.w[i] = w_scales[i];
  return sc;
}

// Adds products `product`'s finished sums, scaled, to their columns of acc.
template <int kCols>
__device__ __forceinline__ void add_scaled_products(float (&acc)[kCols / 2],
                                                    const float (&part)[Tiles<kCols>::kProductCols / 2],
                                                    const ProductScales<kCols>& sc, int product) {
  constexpr int kSteps = Tiles<kCols>::kProductCols / 8;  // 8-column steps of one product group
#pragma unroll
  for (int j = 0; j < kSteps; ++j) {
    const int jt = product * kSteps + j;  // the step within the tile
    const float s0 = sc.x0 * sc.w[j / 2], s1 = sc.x1 * sc.w[j / 2];
    acc[4 * jt + 0] += part[4 * j + 0] * s0;
    acc[4 * jt + 1] += part[4 * j + 1] * s0;
    acc[4 * jt + 2] += part[4 * j + 2] * s1;
    acc[4 * jt + 3] += part[4 * j + 3] * s1;
  }
}

// Persistent: a block per SM takes tiles blockIdx.x, + gridDim.x, …, so that the copies of a
// block's next tile run during its last stages' products and its stores. Both roles walk the
// same tiles and count the same stages (`it`), which sets each stage's slot and phase.
// kTmaWeights (256-row tiles): the weight rows arrive by TMA, two boxes of 128 rows × 128 bytes
// a stage from the expert's tensor map (GroupedGemmArgs::tma_weights), counted in bytes on the
// stage's full barrier; the gathered x rows and the scales stay on cp.async.
// kTmaRows (with kTmaWeights; a.tma_rows): the row-block's x rows are contiguous in a.xq, and
// arrive as one more box of 128 rows × 128 bytes a stage from x_map. Rows past the row-block's
// end are the next expert's (or zeros past xq's end): their products are never stored. The
// products then read only what the async proxy wrote, so the math warps skip the proxy fence.
template <int kCols, bool kTmaWeights = false, bool kTmaRows = false>
__global__ void __launch_bounds__(kThreads, 1)
    expert_gemm_prefill_kernel(GroupedGemmArgs a, int n_tiles, const __grid_constant__ CUtensorMap x_map) {
  static_assert(kTmaWeights || !kTmaRows, "rows by TMA go with weights by TMA");
  using T = Tiles<kCols>;
  constexpr int kStages = T::kStages, kStageBytes = T::kStageBytes, kWeightScales = T::kWeightScales;
  await_previous_kernels();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  const uint32_t smem_addr = shared_address(smem);
  const uint32_t full_bar = smem_addr + T::kBarrierOffset, empty_bar = full_bar + kStages * 8;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      // The copies, and with TMA weights the arrival that expects their bytes.
      mbarrier_init(full_bar + 8 * i, kCopyThreads + (kTmaWeights ? 1 : 0));
      mbarrier_init(empty_bar + 8 * i, kMathGroups * 4);  // a warp's lane 0 each
    }
  }
  __syncthreads();
  const int num_tiles = a.block_offsets[a.num_groups] * n_tiles;

  if (threadIdx.x < kCopyThreads) {
    if constexpr (T::kMoveRegisters)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kCopyRegisters<kTmaWeights>));
    // Copy thread p: 16-byte piece p % 8 of x rows and weight rows p / 8 + 16 j; the scale of x
    // row p; for p < 8, the scale of weight rows 16 p .. 16 p + 15.
    const int p = threadIdx.x, piece = p % kPiecesPerRow, row0 = p / kPiecesPerRow;
    uint32_t it = 0;
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      GemmWeight w;
      int row_begin, row_end, n_block, group;
      if (!locate_tile<kCols>(a, tile, n_tiles, w, row_begin, row_end, n_block, &group)) continue;
      const int num_stages = w.k_padded / kStageK;
      // This thread's x pieces: rows row0 + kRowStep j of the row-block, the first x_pieces of
      // them routed rows, as offsets into a.xq (32 bits, checked at launch: the 256-row tiles'
      // copying path has registers for no more).
      constexpr int kXPieces = kRows / kRowStep;
      const int x_pieces = (row_end - row_begin - row0 + kRowStep - 1) / kRowStep;
      uint32_t x_offset[kXPieces];
#pragma unroll
      for (int j = 0; j < kXPieces; ++j) {
        const int r = row_begin + row0 + kRowStep * j;
        const int64_t row = j >= x_pieces ? 0 : a.src_rows != nullptr ? a.src_rows[r] : r;
        x_offset[j] = static_cast<uint32_t>(row * a.ldx + piece * 16);
      }
      const bool x_scale_valid = row_begin + p < row_end;
      const int64_t x_scale_row =
          !x_scale_valid ? 0 : a.src_rows != nullptr ? a.src_rows[row_begin + p] : row_begin + p;
      const float* x_scale_src = a.x_scales + x_scale_row;
      const int weight_rows = min(kCols, w.n_padded - n_block);
      const int w_pieces = (weight_rows - row0 + kRowStep - 1) / kRowStep;  // this thread's weight rows
      const uint8_t* w_src = static_cast<const uint8_t*>(w.data) +
                             static_cast<int64_t>(n_block + min(row0, weight_rows - 1)) * w.k_padded + piece * 16;
      const bool w_scale_valid = p < kWeightScales && p * kScaleRows < weight_rows;
      const float* w_scale_src =
          w.scales + static_cast<int64_t>(w_scale_valid ? n_block / kScaleRows + p : 0) * num_stages;
      for (int s = 0; s < num_stages; ++s, ++it) {
        const int slot = it % kStages;
        if (it >= kStages) mbarrier_wait(empty_bar + 8 * slot, (it / kStages - 1) & 1);
        unsigned char* stage = smem + slot * kStageBytes;
        const int64_t k0 = static_cast<int64_t>(s) * kStageK;
        if constexpr (!kTmaRows) {
#pragma unroll
          for (int j = 0; j < kXPieces; ++j)
            cp_async16(stage + swizzled_piece_offset(row0 + kRowStep * j, piece), a.xq + x_offset[j] + k0,
                       j < x_pieces);
        }
        if constexpr (kTmaWeights) {
          if (p == 0) {
            // Rows past the weight's n_padded land as zeros and count as bytes all the same.
            constexpr uint32_t kBoxRows = kCols / 2, kBoxBytes = kBoxRows * kStageK, kRowBoxBytes = kRows * kStageK;
            const uint32_t full = full_bar + 8 * slot, stage_addr = smem_addr + slot * kStageBytes;
            mbarrier_arrive_expect_bytes(full, 2 * kBoxBytes + (kTmaRows ? kRowBoxBytes : 0));
            if constexpr (kTmaRows) tma_load_2d(stage_addr, &x_map, static_cast<int>(k0), row_begin, full);
            const CUtensorMap* map = static_cast<const CUtensorMap*>(a.weight_maps) + group;
            for (int box = 0; box < 2; ++box)
              tma_load_2d(stage_addr + T::kWeightOffset + box * kBoxBytes, map, static_cast<int>(k0),
                          n_block + box * static_cast<int>(kBoxRows), full);
          }
        } else {
          const uint8_t* w_stage = w_src + k0;
#pragma unroll
          for (int j = 0; j < kCols / kRowStep; ++j) {
            const bool valid = j < w_pieces;
            cp_async16(stage + T::kWeightOffset + swizzled_piece_offset(row0 + kRowStep * j, piece),
                       w_stage + (valid ? kRowStep * j * w.k_padded : 0), valid);
          }
        }
        cp_async4(stage + T::kXScaleOffset + 4 * p, x_scale_src + s * a.x_scale_rows, x_scale_valid);
        if (p < kWeightScales) cp_async4(stage + T::kWeightScaleOffset + 4 * p, w_scale_src + s, w_scale_valid);
        mbarrier_arrive_after_copies(full_bar + 8 * slot);
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  if constexpr (T::kMoveRegisters)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kMathRegisters<kTmaWeights>));
  // Math warpgroup m: routed rows 64 m + 16 warp + g (+ 8) of each row-block.
  const int m = (threadIdx.x - kCopyThreads) / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int x_offset = m * kGroupRows * kStageK, scale_row = m * kGroupRows + 16 * warp + g;
  uint32_t it = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    GemmWeight w;
    int row_begin, row_end, n_block;
    if (!locate_tile<kCols>(a, tile, n_tiles, w, row_begin, row_end, n_block)) continue;
    const int num_stages = w.k_padded / kStageK;
    const bool has_rows = row_begin + m * kGroupRows < row_end;  // uniform over the warpgroup
    // acc[4 j + e]: routed row 16 warp + g (+ 8 for e >= 2) × weight row 8 j + 2 t + e % 2.
    float acc[kCols / 2] = {};
    for (int s = 0; s < num_stages; ++s, ++it) {
      const int slot = it % kStages;
      mbarrier_wait(full_bar + 8 * slot, (it / kStages) & 1);
#pragma unroll
      for (int product = 0; product < T::kProducts; ++product) {
        float part[T::kProductCols / 2];
        if (has_rows) {
          issue_stage_products<kCols, !kTmaRows>(part, smem_addr + slot * kStageBytes, x_offset, product);
          wgmma_wait_all();
          wgmma_fence_registers(part);
        }
        const ProductScales<kCols> scales = read_product_scales<kCols>(smem + slot * kStageBytes, scale_row, product);
        if (product == T::kProducts - 1) {  // the stage's products are done and its scales read
          __syncwarp();
          if (lane == 0) mbarrier_arrive(empty_bar + 8 * slot);
        }
        if (has_rows) add_scaled_products<kCols>(acc, part, scales, product);
      }
    }
    if (!has_rows) continue;
    if constexpr (kCols == 2 * kScaleCols) {
      if (a.epilogue == GemmEpilogue::kSiluMulE4m3) {
        store_tile_silu_e4m3<kCols>(a, acc, row_begin + scale_row, row_end, n_block, t,
                                    smem + T::kStagingOffset + m * kGroupRows * T::kStagingPitch,
                                    row_begin + m * kGroupRows, m);
        continue;
      }
      if (a.epilogue == GemmEpilogue::kStoreBf16 && a.staged_bf16_stores) {
        store_tile_bf16_staged<kCols>(a, acc, row_end, n_block, t,
                                      smem + T::kStagingOffset + m * kGroupRows * T::kStagingPitch,
                                      scale_row - m * kGroupRows, row_begin + m * kGroupRows, m);
        continue;
      }
    }
    store_tile<kCols>(a, acc, row_begin + scale_row, row_end, n_block, t);
  }
}

template <int kCols, bool kTmaWeights, bool kTmaRows = false>
void launch_blocks(const GroupedGemmArgs& args, int blocks, int n_tiles, Stream stream,
                   const CUtensorMap& x_map = CUtensorMap{}) {
  constexpr auto kernel = expert_gemm_prefill_kernel<kCols, kTmaWeights, kTmaRows>;
  allow_shared_bytes<kernel>(Tiles<kCols>::kBytes);
  launch_kernel(kernel, dim3(blocks), kThreads, Tiles<kCols>::kBytes, stream, args, n_tiles, x_map);
  DS_CUDA_CHECK_LAUNCH();
}

// The e4m3 rows (a.xq, x_scale_rows rows of ldx bytes) as a tensor map of boxes of a row-block's
// rows × one stage's 128 bytes, in the products' 128-byte swizzle.
CUtensorMap row_block_map(const GroupedGemmArgs& args) {
  return encode_tensor_map(TensorMap2d{args.xq, CU_TENSOR_MAP_DATA_TYPE_UINT8, static_cast<uint64_t>(args.ldx),
                                       static_cast<uint64_t>(args.x_scale_rows), static_cast<uint64_t>(args.ldx),
                                       kStageK, kRows, true});
}

template <int kCols>
void launch_tiles(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, Stream stream) {
  const int n_tiles = (max_n_padded + kCols - 1) / kCols;
  const int64_t max_tiles = static_cast<int64_t>(n_tiles) * max_row_blocks;
  DS_CHECK_MSG(max_tiles <= INT32_MAX, "prefill expert blocks: " << max_tiles << " tiles");
  const int blocks = static_cast<int>(std::min<int64_t>(device_multiprocessors(), max_tiles));
  if constexpr (kCols == 256) {
    if (args.tma_weights) {
      DS_CHECK_MSG(args.weight_maps != nullptr, "prefill expert blocks: TMA weights need a tensor map per weight");
      if (args.tma_rows) launch_blocks<kCols, true, true>(args, blocks, n_tiles, stream, row_block_map(args));
      else launch_blocks<kCols, true>(args, blocks, n_tiles, stream);
      return;
    }
  }
  launch_blocks<kCols, false>(args, blocks, n_tiles, stream);
}
}  // namespace

void launch_expert_gemm_prefill(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, Stream stream) {
  DS_CHECK(args.groups != nullptr && args.k_splits == 1 && args.weights_fp8 && args.xq != nullptr &&
           args.x_scales != nullptr && args.ldx % 16 == 0 && args.rows_per_block == kExpertBlockWideRows);
  DS_CHECK(args.ldy % 2 == 0);  // paired stores
  DS_CHECK_MSG(args.x_scale_rows * args.ldx <= UINT32_MAX,
               "prefill expert blocks: " << args.x_scale_rows << " e4m3 rows of " << args.ldx << " bytes");
  if (max_n_padded == 0 || max_row_blocks == 0) return;
  DS_CHECK(args.prefill_weight_rows == 256 || args.prefill_weight_rows == 192 || args.prefill_weight_rows == 128);
  DS_CHECK_MSG(args.epilogue != GemmEpilogue::kSiluMulE4m3 ||
                   (args.prefill_weight_rows == 256 && args.n_out % kScaleCols == 0 && args.ldy % 16 == 0 &&
                    args.y_scales != nullptr && args.y_scale_rows > 0),
               "prefill expert blocks: e4m3 SiLU·up rows need 256-row tiles and whole scale tiles");
  DS_CHECK_MSG(!args.tma_rows || (args.tma_weights && args.src_rows == nullptr && args.prefill_weight_rows == 256),
               "prefill expert blocks: rows by TMA need contiguous row-blocks and 256-row tiles with TMA weights");
  DS_CHECK_MSG(!args.staged_bf16_stores || args.epilogue != GemmEpilogue::kStoreBf16 ||
                   (args.n_out % 8 == 0 && args.ldy % 8 == 0),
               "prefill expert blocks: staged bf16 rows need whole 16-byte pieces");
  if (args.prefill_weight_rows == 256) launch_tiles<256>(args, max_n_padded, max_row_blocks, stream);
  else if (args.prefill_weight_rows == 192) launch_tiles<192>(args, max_n_padded, max_row_blocks, stream);
  else launch_tiles<128>(args, max_n_padded, max_row_blocks, stream);
}

}  // namespace dsinfer::cuda
