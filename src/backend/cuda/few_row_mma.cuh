// The few-row product of e4m3 weights on f16 tensor-core products (GroupedGemmArgs::few_row_mma),
// a device function beside few_row::gemm_block, for the same launches.
//
// Why: the CUDA-core form widens each e4m3 weight through f16 to fp32 before its multiply-add, and
// at batch 1 it is bound by issue: about 130 warp instructions per 16-byte piece of a weight row,
// with three blocks an SM, so it reads e4m3 weights at 1.8 TB/s where bf16 ones stream at 3.2.
// Here one conversion turns two e4m3 weights into the f16 pair an mma fragment holds (every
// e4m3 value is an f16 value), and one mma.sync takes 256 weights of a warp: some 18 instructions
// per piece. x goes to f16 once per block: scaled by a power of two per row so that its largest
// magnitude lies in [2^14, 2^15), which keeps every bf16 value down to 2^-29 of that exact; the
// products are exact and summed in fp32, and the sums scaled back by the same power of two.
//
// The walk: a block takes whole 32-row tiles of the weight (a gate/up weight's tile holds the
// gate and up rows of 16 outputs, so the block applies SiLU·up itself). K goes in chunks of 64
// columns, chunk c to warp c % 4. A step is one chunk of one tile: lane (g, t) reads 16 bytes of
// tile rows g, g + 8, g + 16 and g + 24 at column 64 c + 16 t, the tile's two 16-row groups, and
// the matching 16 f16 of x row g from shared memory. Word j of each piece feeds mma j of the step
// (a K order of our choosing, the same for both operands: fragment columns 2t, 2t+1 are the
// word's low pair, 2t+8, 2t+9 its high pair). Each step's sums are scaled by its 128-column
// block's scale and added in fp32, step after step; the warps' sums of a tile are added in warp
// order at the end. The order of an output's sums depends on K alone.
#pragma once

#include <cuda_fp16.h>

#include "backend/cuda/few_row_gemm.cuh"
#include "backend/cuda/tensor_core.cuh"

namespace dsinfer::cuda::few_row {

constexpr int kMmaChunkCols = 64;      // columns of K of one step (four lanes' 16-byte pieces)
constexpr int kMmaDepth = 4;           // steps in flight per lane: 64 bytes each
constexpr int kMmaMaxTilesPerBlock = 4;
constexpr int kMmaMaxTokens = 8;       // x rows of one mma fragment

// x rows as f16 in shared memory for a product of kTokens rows a pass with K up to ldx.
template <int kTokens>
constexpr size_t mma_shared_bytes(int64_t ldx) {
  return static_cast<size_t>(kTokens) * static_cast<size_t>(ldx) * 2;
}

// The four e4m3 of a word as two f16 pairs, exactly: lo holds bytes 0 and 1, hi bytes 2 and 3
// (the lower byte in the lower half).
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(word));
}

// A block's weight and rows (a row-block of a grouped product, or the dense product's rows). A
// dense weight's are known at once, and a grouped layout that the kernels before the previous
// one wrote may be read before the wait too (located: the block may request its first weight
// pieces before the wait); other grouped layouts only after it. gemm_block keeps the same steps
// inline: on this helper its machine code moved (two registers more in one form).
struct BlockRows {
  GemmWeight w;
  int row_begin = 0, row_end = 0;
  bool has_rows = true, located = false;
  __device__ bool requested() const { return has_rows && located; }
};
__device__ __forceinline__ BlockRows block_rows_before_wait(const GroupedGemmArgs& a, int row_block) {
  BlockRows b;
  if (a.groups == nullptr) {
    b.w = a.dense;
    b.row_end = a.dense_rows;
    b.located = true;
  } else if (a.layout_before_wait && a.num_groups <= kWarpSearchGroups) {
    b.has_rows = grouped_row_block_warp(a, row_block, b.w, b.row_begin, b.row_end);
    b.located = true;
  }
  return b;
}
__device__ __forceinline__ void block_rows_after_wait(const GroupedGemmArgs& a, int row_block, BlockRows& b) {
  if (!b.located) b.has_rows = grouped_row_block_warp(a, row_block, b.w, b.row_begin, b.row_end);
}

// The pass's x rows [pass_begin, pass_begin + pass_rows) of the block's row range, columns [0, k),
// into x_f16 [kTokens][ldx] as f16 scaled by 2^S per row (the largest magnitude into [2^14,
// 2^15)); unscale[r] = 2^-S. Ends with the block synchronised.
template <int kTokens>
__device__ __forceinline__ void stage_x_rows_f16(const GroupedGemmArgs& a, int pass_begin, int pass_rows, int k,
                                                 uint16_t* x_f16, float (&unscale)[kTokens],
                                                 uint32_t (&warp_max)[kWarps][kTokens]) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int num_pieces = k / 8;  // 8 bf16 a piece
  const uint4* rows[kTokens];
#pragma unroll
  for (int r = 0; r < kTokens; ++r) {
    int64_t row = 0;
    if (r < pass_rows) row = a.src_rows != nullptr ? a.src_rows[pass_begin + r] : pass_begin + r;
    rows[r] = reinterpret_cast<const uint4*>(a.x + row * a.ldx);
    // The largest |x| as bf16 bits (the order of non-negative bf16 values is that of their bits).
    uint32_t pair_max = 0;
    if (r < pass_rows) {
      for (int p = tid; p < num_pieces; p += kThreads) {
        const uint4 v = __ldg(rows[r] + p);
        pair_max = __vmaxu2(pair_max, __vmaxu2(__vmaxu2(v.x & 0x7fff7fffu, v.y & 0x7fff7fffu),
                                               __vmaxu2(v.z & 0x7fff7fffu, v.w & 0x7fff7fffu)));
      }
    }
    const uint32_t m = __reduce_max_sync(0xffffffffu, max(pair_max & 0xffffu, pair_max >> 16));
    if (lane == 0) warp_max[warp][r] = m;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kTokens; ++r) {
    if (r >= pass_rows) break;
    uint32_t m = warp_max[0][r];
#pragma unroll
    for (int q = 1; q < kWarps; ++q) m = max(m, warp_max[q][r]);
    // S = 14 - E for a largest magnitude in [2^E, 2^(E+1)) (E of a subnormal: -126); within
    // [-126, 126] so that 2^S and 2^-S are normal floats.
    const int biased = max(static_cast<int>(m >> 7), 1);
    const int s = m == 0 ? 0 : min(126, max(-126, 14 - (biased - 127)));
    const float scale = __int_as_float((s + 127) << 23);
    if (tid == 0) unscale[r] = __int_as_float((127 - s) << 23);
    uint4* dst = reinterpret_cast<uint4*>(x_f16 + static_cast<int64_t>(r) * a.ldx);
    for (int p = tid; p < num_pieces; p += kThreads) {
      const uint4 v = __ldg(rows[r] + p);
      const uint32_t in[4] = {v.x, v.y, v.z, v.w};
      uint32_t out[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = scaled_half2_of_bf16x2(in[i], scale);
      dst[p] = make_uint4(out[0], out[1], out[2], out[3]);
    }
  }
  __syncthreads();
}

// Block block_x of a product takes tiles_per_block consecutive 32-row tiles of one weight (one
// group's, for the grouped form: row_block is the row-block); rows go kTokens at a time (passes).
// The first kDepth steps of a known weight are requested before the wait, as in gemm_block.
template <int kTokens>
__device__ __forceinline__ void gemm_block_mma(const GroupedGemmArgs& a, int tiles_per_block, int block_x,
                                               int row_block) {
  static_assert(kTokens <= kMmaMaxTokens, "one fragment of x rows");
  extern __shared__ __align__(16) uint16_t few_row_x_f16[];  // [kTokens][ldx]: the pass's x rows, scaled
  __shared__ float warp_sums[kWarps][kMmaMaxTilesPerBlock][kGemmTileRows][kTokens];
  __shared__ float unscale[kTokens];
  __shared__ float rms_sums[kWarps][kTokens];
  __shared__ float4 rms_stage[kTokens][kThreads];
  __shared__ uint32_t warp_max[kWarps][kTokens];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const bool gate_up = a.epilogue == GemmEpilogue::kSiluMulBf16;
  const int first_tile = block_x * tiles_per_block;
  struct Walk {
    int num_tiles = 0, warp_chunks = 0, num_steps = 0, scale_cols = 0;
    StepDivisor chunks;  // step s: tile s / warp_chunks, chunk s % warp_chunks
  };
  auto walk_of = [&](const GemmWeight& w) {
    Walk k;
    k.num_tiles = max(0, min(tiles_per_block, w.n_padded / kGemmTileRows - first_tile));
    const int num_chunks = (w.k_padded + kMmaChunkCols - 1) / kMmaChunkCols;
    k.warp_chunks = warp < num_chunks ? (num_chunks - warp + kWarps - 1) / kWarps : 0;
    k.num_steps = k.num_tiles * k.warp_chunks;
    k.chunks = StepDivisor(k.warp_chunks);
    k.scale_cols = (w.k_padded + kScaleCols - 1) / kScaleCols;
    return k;
  };
  // Step s: the warp's chunk s % warp_chunks of tile s / warp_chunks.
  struct Step {
    uint4 rows[4];    // tile rows g, g + 8, g + 16, g + 24
    float scales[2];  // the two 16-row groups' scales for the chunk's 128 columns
  };
  auto chunk_col = [&](const Walk& k, int s) {
    return (warp + kWarps * (s - k.chunks.quotient(s) * k.warp_chunks)) * kMmaChunkCols;
  };
  // Zeros past the walk's steps and K (predicated loads: load_weight_piece_if has the why).
  const uint64_t policy = weight_l2_policy(a.weights_evict_first);
  auto issue = [&](const GemmWeight& w, const Walk& k, int s, Step& dst) {
    const bool in_walk = s < k.num_steps;
    const int tile = first_tile + k.chunks.quotient(s), chunk0 = chunk_col(k, s), col = chunk0 + 16 * t;
    const char* data = static_cast<const char*>(w.data) + col;
#pragma unroll
    for (int r = 0; r < 4; ++r)
      dst.rows[r] = load_weight_piece_if(in_walk && col < w.k_padded,
                                         data + static_cast<int64_t>(tile * kGemmTileRows + g + 8 * r) * w.k_padded,
                                         policy);
#pragma unroll
    for (int gi = 0; gi < 2; ++gi)
      dst.scales[gi] = in_walk ? w.scales[(2 * tile + gi) * k.scale_cols + chunk0 / kScaleCols] : 0.0f;
  };
  BlockRows rows = block_rows_before_wait(a, row_block);
  const bool requested = rows.requested();
  Step steps[kMmaDepth];
  if (requested) {
    const Walk k = walk_of(rows.w);
#pragma unroll
    for (int d = 0; d < kMmaDepth; ++d) issue(rows.w, k, d, steps[d]);
  }
  await_previous_kernels();
  block_rows_after_wait(a, row_block, rows);
  if (!rows.has_rows) return;
  const GemmWeight w = rows.w;
  const Walk k = walk_of(w);
  if (k.num_tiles == 0) return;  // uniform over the block
  // The lane's sums of tile rows 16 gi + g + 8 rr, x rows 2t and 2t + 1 of the pass.
  auto keep_sums = [&](int tile_index, const float (&acc)[2][4]) {
#pragma unroll
    for (int gi = 0; gi < 2; ++gi)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (2 * t + e < kTokens) warp_sums[warp][tile_index][16 * gi + g + 8 * rr][2 * t + e] = acc[gi][2 * rr + e];
  };
  for (int pass_begin = rows.row_begin; pass_begin < rows.row_end; pass_begin += kTokens) {
    const int pass_rows = min(kTokens, rows.row_end - pass_begin);
    if (!requested || pass_begin != rows.row_begin) {
#pragma unroll
      for (int d = 0; d < kMmaDepth; ++d) issue(w, k, d, steps[d]);
    }
    // Where a norm left each row's 1 / rms to this product: the thread's share of its partial
    // sums, requested now and added at the end (few_row_gemm.cuh has the same).
    const bool scaled = a.rms_scale.partials != nullptr;
    int64_t x_rows[kTokens];
#pragma unroll
    for (int r = 0; r < kTokens; ++r)
      x_rows[r] = r < pass_rows ? (a.src_rows != nullptr ? a.src_rows[pass_begin + r] : pass_begin + r) : 0;
    if (scaled) {
#pragma unroll
      for (int r = 0; r < kTokens; ++r)
        if (r < pass_rows) stage_rms_share<kThreads>(a.rms_scale, x_rows[r], rms_stage[r]);
      cp_async_commit();
    }
    stage_x_rows_f16<kTokens>(a, pass_begin, pass_rows, w.k_padded, few_row_x_f16, unscale, warp_max);
    const uint16_t* x_row = few_row_x_f16 + static_cast<int64_t>(min(g, kTokens - 1)) * a.ldx;
    float acc[2][4] = {};
    for (int s0 = 0; s0 < k.num_steps; s0 += kMmaDepth) {
#pragma unroll
      for (int d = 0; d < kMmaDepth; ++d) {
        const int s = s0 + d;
        if (s >= k.num_steps) break;
        const int col = chunk_col(k, s) + 16 * t;
        uint4 xa = make_uint4(0, 0, 0, 0), xb = xa;
        if (g < pass_rows && col < w.k_padded) {
          const auto* xp = reinterpret_cast<const uint4*>(x_row + col);
          xa = xp[0];
          xb = xp[1];
        }
        const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
        for (int gi = 0; gi < 2; ++gi) {
          const uint4& lo_row = steps[d].rows[2 * gi];
          const uint4& hi_row = steps[d].rows[2 * gi + 1];
          const uint32_t lo_words[4] = {lo_row.x, lo_row.y, lo_row.z, lo_row.w};
          const uint32_t hi_words[4] = {hi_row.x, hi_row.y, hi_row.z, hi_row.w};
          float sums[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            uint32_t frag[4];
            e4m3x4_to_f16x2x2(lo_words[j], frag[0], frag[2]);
            e4m3x4_to_f16x2x2(hi_words[j], frag[1], frag[3]);
            mma_f16_16x8x16(sums, frag, xw[2 * j], xw[2 * j + 1]);
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[gi][i] = fmaf(sums[i], steps[d].scales[gi], acc[gi][i]);
        }
        const int tile_index = k.chunks.quotient(s);
        const bool tile_done = s - tile_index * k.warp_chunks == k.warp_chunks - 1;
        issue(w, k, s + kMmaDepth, steps[d]);
        if (tile_done) {
          keep_sums(tile_index, acc);
#pragma unroll
          for (int gi = 0; gi < 2; ++gi)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[gi][i] = 0.0f;
        }
      }
    }
    // A warp without chunks (K below four of them) adds zeros.
    if (k.warp_chunks == 0)
      for (int i = 0; i < k.num_tiles; ++i) keep_sums(i, acc);
    if (scaled) {
      cp_async_wait<0>();
#pragma unroll
      for (int r = 0; r < kTokens; ++r) {
        const auto row_of = [&] {
          return a.src_rows != nullptr ? int64_t{a.src_rows[pass_begin + r]} : int64_t{pass_begin + r};
        };
        const float v = r < pass_rows ? warp_sum(rms_share_sum<kThreads>(a.rms_scale, rms_stage[r], row_of)) : 0.0f;
        if (lane == 0) rms_sums[warp][r] = v;
      }
    }
    __syncthreads();
    float rms[kTokens];
#pragma unroll
    for (int r = 0; r < kTokens; ++r)
      rms[r] = scaled ? rms_scale_of<kWarps>(&rms_sums[0][r], kTokens, a.rms_scale) : 1.0f;
    // Outputs in row order; the warps' sums added in warp order, then scaled back (and by the
    // row's 1 / rms where scaled).
    auto total = [&](int i, int row, int r) {
      float v = warp_sums[0][i][row][r];
#pragma unroll
      for (int q = 1; q < kWarps; ++q) v += warp_sums[q][i][row][r];
      v *= unscale[r];
      return scaled ? v * scale_of_row(rms, r) : v;
    };
    const int outs_per_tile = gate_up ? kGemmGateUpHalf : kGemmTileRows;
    const int outs = k.num_tiles * outs_per_tile;
    for (int idx = tid; idx < pass_rows * outs; idx += kThreads) {
      const int r = idx / outs, i = idx % outs / outs_per_tile, o = idx % outs_per_tile;
      const int out = (first_tile + i) * outs_per_tile + o;
      if (out >= a.n_out) continue;
      const int64_t y_row = static_cast<int64_t>(pass_begin + r) * a.ldy;
      if (gate_up) {
        const float gate = total(i, o, r), up = total(i, kGemmGateUpHalf + o, r);
        static_cast<__nv_bfloat16*>(a.y)[y_row + out] = __float2bfloat16_rn(gate / (1.0f + expf(-gate)) * up);
      } else {
        static_cast<float*>(a.y)[y_row + out] = total(i, o, r);
      }
    }
    __syncthreads();  // the next pass reuses warp_sums, unscale and x_f16
  }
}

}  // namespace dsinfer::cuda::few_row
