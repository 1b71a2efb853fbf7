// The few-row product's work for one thread block (few_row_gemm.cu has the why), as a device
// function: its own kernel runs it in every block, and a kernel that shares its launch with
// another short job (moe_routing_beside.cu) runs it in the blocks after that job's.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/row_rms.cuh"
#include "backend/cuda/step_divisor.h"
#include "backend/cuda/weight_load.cuh"

namespace dsinfer::cuda::few_row {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
// Weight rows per quad: four outputs, or two outputs' gate and up rows.
constexpr int kQuadRows = 4;
// Steps (one 16-byte piece of each of a quad's rows per thread) in flight per thread.
constexpr int kDepth = 4;
// A block takes up to this many consecutive quads of one weight.
constexpr int kMaxQuadsPerBlock = 32;

// The eight bf16 of a 16-byte piece (little-endian: the low half of a word comes first).
__device__ __forceinline__ void widen_bf16x8(const uint4& v, float (&out)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// The sixteen e4m3 of a 16-byte piece, exactly.
__device__ __forceinline__ void widen_e4m3x16(const uint4& v, float (&out)[16]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 f = widen_e4m3x4(words[i]);
    out[4 * i] = f.x;
    out[4 * i + 1] = f.y;
    out[4 * i + 2] = f.z;
    out[4 * i + 3] = f.w;
  }
}

// A word of two bf16 (the low half first) times `scale`, as an f16 pair's bits.
__device__ __forceinline__ uint32_t scaled_half2_of_bf16x2(uint32_t word, float scale) {
  const __half2 h = __floats2half2_rn(__uint_as_float(word << 16) * scale, __uint_as_float(word & 0xffff0000u) * scale);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Sixteen bf16 of x (two 16-byte pieces, a and b) as eight f16 pairs, scaled by the power of two
// that puts their largest magnitude in [1, 2); returns the power's inverse. Every value within
// 2^-14 of the largest stays exact (f16 keeps bf16's 8 mantissa bits with 3 to spare); smaller
// ones keep what f16's subnormals hold, a part in 2^24 of the largest or less.
__device__ __forceinline__ float scaled_halves_of_bf16x16(const uint4& a, const uint4& b, uint4& half_a,
                                                          uint4& half_b) {
  const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint32_t top = 0;  // the largest magnitude's bits (bf16 bits order as magnitudes do)
#pragma unroll
  for (int i = 0; i < 8; ++i) top = max(top, max(words[i] & 0x7fffu, (words[i] >> 16) & 0x7fffu));
  // The biased exponent, within the range where both powers below are normal floats.
  const uint32_t exponent = min(max(top >> 7, 1u), 253u);
  const float scale = __uint_as_float((254u - exponent) << 23);  // 2^(127 - exponent)
  uint32_t halves[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) halves[i] = scaled_half2_of_bf16x2(words[i], scale);
  half_a = make_uint4(halves[0], halves[1], halves[2], halves[3]);
  half_b = make_uint4(halves[4], halves[5], halves[6], halves[7]);
  return __uint_as_float(exponent << 23);  // 2^(exponent - 127)
}

// Sixteen fp32 of x (four 16-byte pieces) as eight f16 pairs, scaled as scaled_halves_of_bf16x16
// scales bf16 ones: by the power of two that puts their largest magnitude in [1, 2), each then
// rounded to f16's 11 significant bits (bf16 keeps 8). Returns the power's inverse.
__device__ __forceinline__ float scaled_halves_of_f32x16(const uint4 (&v)[4], uint4& half_a, uint4& half_b) {
  const uint32_t words[16] = {v[0].x, v[0].y, v[0].z, v[0].w, v[1].x, v[1].y, v[1].z, v[1].w,
                              v[2].x, v[2].y, v[2].z, v[2].w, v[3].x, v[3].y, v[3].z, v[3].w};
  uint32_t top = 0;  // the largest magnitude's bits (fp32 bits order as magnitudes do)
#pragma unroll
  for (int i = 0; i < 16; ++i) top = max(top, words[i] & 0x7fffffffu);
  const uint32_t exponent = min(max(top >> 23, 1u), 253u);
  const float scale = __uint_as_float((254u - exponent) << 23);  // 2^(127 - exponent)
  uint32_t halves[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __half2 h =
        __floats2half2_rn(__uint_as_float(words[2 * i]) * scale, __uint_as_float(words[2 * i + 1]) * scale);
    halves[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  half_a = make_uint4(halves[0], halves[1], halves[2], halves[3]);
  half_b = make_uint4(halves[4], halves[5], halves[6], halves[7]);
  return __uint_as_float(exponent << 23);  // 2^(exponent - 127)
}

// The two e4m3 of a 16-bit pair (the low byte first) as an f16 pair, exactly.
__device__ __forceinline__ __half2 half2_of_e4m3x2(uint32_t pair) {
  return __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3));
}

// The dot product of a 16-byte piece of e4m3 weights (as stored, before their block's scale) with
// sixteen x held as scaled_halves_of_bf16x16 left them, in f16 pairs: two chains of four f16
// products a half each, their sum then in fp32. The bounds that keep it finite: an e4m3 magnitude
// is at most 448 and a scaled x below 2, so a half's sum stays below 4 * 896 and the pair's two
// halves' sums below 7,168, far inside f16's 65,504.
__device__ __forceinline__ float dot_e4m3x16_halves(const __half2 (&w_halves)[8], const uint4& x_a,
                                                    const uint4& x_b) {
  const uint32_t xs[8] = {x_a.x, x_a.y, x_a.z, x_a.w, x_b.x, x_b.y, x_b.z, x_b.w};
  __half2 sums[2] = {__float2half2_rn(0.0f), __float2half2_rn(0.0f)};
#pragma unroll
  for (int i = 0; i < 8; ++i)
    sums[i / 4] = __hfma2(w_halves[i], *reinterpret_cast<const __half2*>(&xs[i]), sums[i / 4]);
  const float2 f = __half22float2(__hadd2(sums[0], sums[1]));
  return f.x + f.y;
}

// The 8 fp32 columns of x's piece p (16-byte aligned) as two 16-byte pieces, or zeros where not
// `read` (x then need not point anywhere).
__device__ __forceinline__ void load_f32_piece(bool read, const float* x, uint4& lo, uint4& hi) {
  const auto* v = reinterpret_cast<const uint4*>(x);
  lo = read ? __ldg(v) : make_uint4(0, 0, 0, 0);
  hi = read ? __ldg(v + 1) : make_uint4(0, 0, 0, 0);
}

// Weight row r of quad q: outputs 4q .. 4q + 3, or the gate and up rows of outputs 2q and
// 2q + 1 (interleaved 16 rows at a time within each 32-row tile).
__device__ __forceinline__ int quad_row(bool gate_up, int q, int r) {
  if (!gate_up) return q * kQuadRows + r;
  const int out = q * 2 + r / 2;
  return (out / kGemmGateUpHalf) * kGemmTileRows + (r % 2) * kGemmGateUpHalf + out % kGemmGateUpHalf;
}

// Block block_x of a product takes quads_per_block consecutive quads of one weight (one group's,
// for the grouped form: row_block is the row-block) and walks them in steps: step s is piece
// (s % phases) * 128 + thread of each row of its (s / phases)-th quad, so that a warp reads 512
// bytes in a row. kDepth steps are in flight per thread, each issued as the one kDepth before it
// is consumed; a dense weight's first kDepth are issued before the kernel waits for the ones
// before it, and stream in while they finish. A quad's sums stay in registers until its last
// step, when each warp adds its lanes' and keeps them in shared memory; the warps' sums are
// added in order at the end. Rows go kTokens at a time (passes).
//
// kFixedPhases > 0 (1, 2 or 4, a divisor of kDepth): every weight of the call has at most that
// many phases, walked as if it had exactly that many (a phase past a row's last piece reads and
// adds nothing, so the sums keep their order and bits). Step s's quad and phase are then known
// at compile time from s's place in its group of kDepth, and each thread's x pieces are read once
// a pass into registers (e4m3 rows of four phases: shared memory) instead of again at every quad.
//
// kXF32 (one row): x's row is read in fp32 from a.x_f32. Over bf16 weights a fixed walk of one
// or two phases holds the thread's pieces in registers (two 16-byte pieces a phase, the registers
// of a bf16 walk of four); longer walks read them at every step (from L1), where held they
// would take 32 registers more. Over e4m3 weights the fixed walk holds them as f16 pairs
// (scaled_halves_of_f32x16: the registers of bf16 rows), other walks read them at every step.
template <int kTokens, bool kFp8, int kFixedPhases = 0, bool kXF32 = false>
__device__ __forceinline__ void gemm_block(const GroupedGemmArgs& a, int quads_per_block, int block_x,
                                           int row_block) {
  static_assert(kFixedPhases >= 0 && kDepth % (kFixedPhases > 0 ? kFixedPhases : 1) == 0,
                "a fixed phase count divides the steps in flight");
  static_assert(!kXF32 || kTokens == 1, "fp32 rows: passes of one row");
  constexpr bool kFixed = kFixedPhases > 0;
  constexpr bool kXF32Held = kXF32 && !kFp8 && kFixed && kFixedPhases <= 2;
  constexpr int kPieceElems = kFp8 ? 16 : 8;  // weights per 16-byte piece
  constexpr int kXPieces = kPieceElems / 8;   // 16-byte pieces of bf16 x a weight piece takes
  // e4m3 weights in the fixed walk multiply in f16 pairs (dot_e4m3x16_halves): half the
  // instructions of widening each weight to fp32 (FP8 decode at batch 1 7% faster).
  constexpr bool kHalfProducts = kFp8 && kFixed;
  // Their x pieces of three or four phases (K up to 8,192 columns, as V3's 7,168) stay in shared
  // memory, each thread's own, rather than in registers, where they would spill.
  constexpr bool kXShared = kHalfProducts && kFixedPhases > 2;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const bool gate_up = a.epilogue == GemmEpilogue::kSiluMulBf16 || a.epilogue == GemmEpilogue::kSiluMulF32;
  const int first_quad = block_x * quads_per_block;
  struct Walk {
    int num_pieces = 0, num_phases = 0, num_quads = 0, num_steps = 0;
    StepDivisor phases;  // step s: quad s / num_phases, phase s % num_phases
  };
  auto walk_of = [&](const GemmWeight& w) {
    Walk k;
    k.num_pieces = w.k_padded / kPieceElems;
    k.num_phases = kFixed ? kFixedPhases : (k.num_pieces + kThreads - 1) / kThreads;
    k.num_quads = max(0, min(quads_per_block, w.n_padded / kQuadRows - first_quad));
    k.num_steps = k.num_quads * k.num_phases;
    k.phases = StepDivisor(k.num_phases);
    return k;
  };
  uint4 pieces[kDepth][kQuadRows];
  const uint64_t policy = weight_l2_policy(a.weights_evict_first);
  auto issue = [&](const GemmWeight& w, const Walk& k, int s, uint4 (&dst)[kQuadRows]) {
    const int quad = kFixed ? s / kFixedPhases : k.phases.quotient(s), q = first_quad + quad;
    const int p = (s - quad * k.num_phases) * kThreads + tid;
    const bool valid = s < k.num_steps && p < k.num_pieces;
    const int64_t row_bytes = kFp8 ? w.k_padded : 2 * static_cast<int64_t>(w.k_padded);
    // A quad's rows lie at the same distances from its first in every quad, quad 0's rows (r,
    // or for a gate/up weight, whose quads take two adjacent outputs of one 16-row group, 0, 16,
    // 1 and 17).
    const char* first = static_cast<const char*>(w.data) + p * 16 + quad_row(gate_up, q, 0) * row_bytes;
#pragma unroll
    for (int r = 0; r < kQuadRows; ++r)
      dst[r] = valid ? load_weight_piece(first + quad_row(gate_up, 0, r) * row_bytes, policy) : make_uint4(0, 0, 0, 0);
  };
  // The block's weight and rows: a dense weight's are known at once, and a grouped layout that
  // the kernels before the previous one wrote may be read before the wait too; either way the
  // first kDepth steps are then requested before it.
  const bool dense = a.groups == nullptr;
  const bool layout_early = !dense && a.layout_before_wait && a.num_groups <= kWarpSearchGroups;
  GemmWeight w;
  int row_begin = 0, row_end = 0;
  bool has_rows = true;
  if (dense) {
    w = a.dense;
    row_end = a.dense_rows;
  } else if (layout_early) {
    has_rows = grouped_row_block_warp(a, row_block, w, row_begin, row_end);
  }
  const bool requested = has_rows && (dense || layout_early);
  if (requested) {
    const Walk k = walk_of(w);
#pragma unroll
    for (int d = 0; d < kDepth; ++d) issue(w, k, d, pieces[d]);
  }
  await_previous_kernels();
  if (!dense && !layout_early) has_rows = grouped_row_block_warp(a, row_block, w, row_begin, row_end);
  if (!has_rows) return;
  const Walk k = walk_of(w);
  if (k.num_steps == 0) return;
  const int scale_cols = (w.k_padded + kScaleCols - 1) / kScaleCols;
  __shared__ float warp_sums[kWarps][kMaxQuadsPerBlock][kQuadRows][kTokens];
  __shared__ float rms_sums[kWarps][kTokens];
  __shared__ float4 rms_stage[kTokens][kThreads];
  __shared__ float4 residual_stage[kThreads][2];  // the residual form's first quad: x and the norm's weight
  for (int pass_begin = row_begin; pass_begin < row_end; pass_begin += kTokens) {
    const int pass_rows = min(kTokens, row_end - pass_begin);
    if (!requested || pass_begin != row_begin) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) issue(w, k, d, pieces[d]);
    }
    int64_t x_rows[kTokens], x_offset[kTokens];
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      x_rows[t] = 0;
      if (t < pass_rows) x_rows[t] = a.src_rows != nullptr ? a.src_rows[pass_begin + t] : pass_begin + t;
      x_offset[t] = x_rows[t] * (kXF32 ? a.ldx_f32 : a.ldx);
    }
    // Where a norm left each row's 1 / rms to this product: the thread's share of its partial
    // sums, requested now and added at the end, and the residual and norm weight of the first quad
    // this thread writes in the residual form (the epilogue's reads), copied to shared memory
    // meanwhile, where they hold no registers.
    const bool scaled = a.rms_scale.partials != nullptr;
    if (scaled) {
#pragma unroll
      for (int t = 0; t < kTokens; ++t)
        if (t < pass_rows) stage_rms_share<kThreads>(a.rms_scale, x_rows[t], rms_stage[t]);
    }
    const ResidualNormOutput& res = a.residual_norm;
    if (res.x != nullptr && tid < pass_rows * k.num_quads) {
      const int t = tid / k.num_quads, q = first_quad + tid % k.num_quads;
      cp_async16(&residual_stage[tid][0], res.x + (pass_begin + t) * a.ldy + q * kQuadRows, true);
      cp_async16(&residual_stage[tid][1], res.w + q * kQuadRows, true);
    }
    cp_async_commit();
    // The fixed walk's x pieces of this thread, phase by phase (zeros past the row's pieces); for
    // e4m3 weights as scaled f16 pairs, with the inverse of each phase's scale.
    constexpr int kHeldPieces = kFixed ? kFixedPhases * (kXF32Held ? 2 : kXPieces) : 1;
    uint4 x_held[kTokens][kXShared ? 1 : kHeldPieces];
    __shared__ uint4 x_shared[kXShared ? kTokens * kHeldPieces : 1][kThreads];
    float x_unscale[kTokens][kHalfProducts ? kFixedPhases : 1];
    // x's 16-byte piece i of token t, as held.
    auto x_piece = [&](int t, int i) -> uint4& {
      if constexpr (kXShared) return x_shared[t * kHeldPieces + i][tid];
      else return x_held[t][i];
    };
    if constexpr (kXF32Held) {
#pragma unroll
      for (int ph = 0; ph < kFixedPhases; ++ph) {
        const int p = ph * kThreads + tid;
        load_f32_piece(pass_rows > 0 && p * kPieceElems < a.x_f32_cols, a.x_f32 + x_offset[0] + p * kPieceElems,
                       x_held[0][2 * ph], x_held[0][2 * ph + 1]);
      }
    } else if constexpr (kHalfProducts && kXF32) {
#pragma unroll
      for (int ph = 0; ph < kFixedPhases; ++ph) {
        const int p = ph * kThreads + tid;
        uint4 v[4];
#pragma unroll
        for (int h = 0; h < 2; ++h)
          load_f32_piece(p * kPieceElems + 8 * h < a.x_f32_cols, a.x_f32 + x_offset[0] + p * kPieceElems + 8 * h,
                         v[2 * h], v[2 * h + 1]);
        uint4 half_a, half_b;
        x_unscale[0][ph] = scaled_halves_of_f32x16(v, half_a, half_b);
        x_piece(0, 2 * ph) = half_a;
        x_piece(0, 2 * ph + 1) = half_b;
      }
    } else if constexpr (kFixed && !kXF32) {
#pragma unroll
      for (int t = 0; t < kTokens; ++t)
#pragma unroll
        for (int ph = 0; ph < kFixedPhases; ++ph) {
          const int p = ph * kThreads + tid;
          const auto* x = reinterpret_cast<const uint4*>(a.x + x_offset[t] + p * kPieceElems);
          uint4 v[kXPieces];
#pragma unroll
          for (int h = 0; h < kXPieces; ++h)
            v[h] = t < pass_rows && p < k.num_pieces ? __ldg(x + h) : make_uint4(0, 0, 0, 0);
          if constexpr (kHalfProducts) {
            uint4 half_a, half_b;
            x_unscale[t][ph] = scaled_halves_of_bf16x16(v[0], v[1], half_a, half_b);
            x_piece(t, 2 * ph) = half_a;
            x_piece(t, 2 * ph + 1) = half_b;
          } else {
#pragma unroll
            for (int h = 0; h < kXPieces; ++h) x_piece(t, ph * kXPieces + h) = v[h];
          }
        }
    }
    float acc[kQuadRows][kTokens];
#pragma unroll
    for (int r = 0; r < kQuadRows; ++r)
#pragma unroll
      for (int t = 0; t < kTokens; ++t) acc[r][t] = 0.0f;

    for (int s0 = 0; s0 < k.num_steps; s0 += kDepth) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int s = s0 + d;
        if (s >= k.num_steps) break;
        // s0 is a multiple of kDepth, so the fixed walk's quad and phase follow from d.
        const int i = kFixed ? s0 / kFixedPhases + d / kFixedPhases : k.phases.quotient(s);
        const int phase = kFixed ? d % kFixedPhases : s - i * k.num_phases;
        const int p = phase * kThreads + tid;
        if constexpr (kHalfProducts) {
          if (p < k.num_pieces) {
#pragma unroll
            for (int r = 0; r < kQuadRows; ++r) {
              const uint32_t words[4] = {pieces[d][r].x, pieces[d][r].y, pieces[d][r].z, pieces[d][r].w};
              __half2 w_halves[8];
#pragma unroll
              for (int j = 0; j < 8; ++j) w_halves[j] = half2_of_e4m3x2(j % 2 == 0 ? words[j / 2] : words[j / 2] >> 16);
              const int row = quad_row(gate_up, first_quad + i, r);
              const float scale = w.scales[(row / 16) * scale_cols + p * kPieceElems / kScaleCols];
#pragma unroll
              for (int t = 0; t < kTokens; ++t) {
                const float sum = dot_e4m3x16_halves(w_halves, x_piece(t, 2 * phase), x_piece(t, 2 * phase + 1));
                acc[r][t] = fmaf(sum, scale * x_unscale[t][phase], acc[r][t]);
              }
            }
          }
        } else if (p < k.num_pieces) {
          // x's matching elements, as rounded to bf16 by the conversion before the product.
          float xf[kTokens][kPieceElems];
#pragma unroll
          for (int t = 0; t < kTokens; ++t) {
            if constexpr (kXF32) {
              // x_f32_cols is a multiple of 8: each 8 of a piece's columns are all read or all zeros.
#pragma unroll
              for (int h = 0; h < kXPieces; ++h) {
                uint4 lo, hi;
                if constexpr (kXF32Held) {
                  lo = x_held[t][2 * phase];
                  hi = x_held[t][2 * phase + 1];
                } else {
                  const int col = p * kPieceElems + 8 * h;
                  load_f32_piece(t < pass_rows && col < a.x_f32_cols, a.x_f32 + x_offset[t] + col, lo, hi);
                }
                const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
                for (int e = 0; e < 8; ++e) xf[t][8 * h + e] = __uint_as_float(words[e]);
              }
            } else {
#pragma unroll
              for (int h = 0; h < kXPieces; ++h) {
                float part[8];
                uint4 v;
                if constexpr (kFixed) {
                  v = x_piece(t, phase * kXPieces + h);
                } else {
                  const auto* x = reinterpret_cast<const uint4*>(a.x + x_offset[t] + p * kPieceElems);
                  v = t < pass_rows ? __ldg(x + h) : make_uint4(0, 0, 0, 0);
                }
                widen_bf16x8(v, part);
#pragma unroll
                for (int e = 0; e < 8; ++e) xf[t][8 * h + e] = part[e];
              }
            }
          }
#pragma unroll
          for (int r = 0; r < kQuadRows; ++r) {
            float wf[kPieceElems];
            if constexpr (kFp8) {
              widen_e4m3x16(pieces[d][r], wf);
              // The piece lies in one 128-column scale block: its sums, scaled in fp32 (the
              // checkpoint's weights, unrounded).
              const int row = quad_row(gate_up, first_quad + i, r);
              const float scale = w.scales[(row / 16) * scale_cols + p * kPieceElems / kScaleCols];
#pragma unroll
              for (int t = 0; t < kTokens; ++t) {
                float sum = 0.0f;
#pragma unroll
                for (int e = 0; e < kPieceElems; ++e) sum = fmaf(wf[e], xf[t][e], sum);
                acc[r][t] = fmaf(sum, scale, acc[r][t]);
              }
            } else {
              widen_bf16x8(pieces[d][r], wf);
#pragma unroll
              for (int t = 0; t < kTokens; ++t)
#pragma unroll
                for (int e = 0; e < kPieceElems; ++e) acc[r][t] = fmaf(wf[e], xf[t][e], acc[r][t]);
            }
          }
        }
        issue(w, k, s + kDepth, pieces[d]);
        if (phase == k.num_phases - 1) {
          // The quad's last step: each warp's sums over its lanes, the four rows scattered over
          // the lanes as they are added (six shuffles a token instead of twenty). Each level
          // adds the same pairs of lanes as a butterfly over each row would (xor 16, 8, 4, 2,
          // 1), so the sums are the same bits: after xor 16 a lane keeps two rows' partial sums
          // (rows 0, 1 below lane 16; 2, 3 from it), after xor 8 one (row lane / 8 % 4), and
          // lanes 0, 8, 16 and 24 end with rows 0 to 3.
          static_assert(kQuadRows == 4, "two levels scatter four rows");
          const bool upper16 = (lane & 16) != 0, upper8 = (lane & 8) != 0;
#pragma unroll
          for (int t = 0; t < kTokens; ++t) {
            const float kept0 = (upper16 ? acc[2][t] : acc[0][t]) +
                                __shfl_xor_sync(0xffffffffu, upper16 ? acc[0][t] : acc[2][t], 16);
            const float kept1 = (upper16 ? acc[3][t] : acc[1][t]) +
                                __shfl_xor_sync(0xffffffffu, upper16 ? acc[1][t] : acc[3][t], 16);
            float v = (upper8 ? kept1 : kept0) + __shfl_xor_sync(0xffffffffu, upper8 ? kept0 : kept1, 8);
#pragma unroll
            for (int offset = 4; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
            if (lane % 8 == 0) warp_sums[warp][i][lane / 8][t] = v;
          }
#pragma unroll
          for (int r = 0; r < kQuadRows; ++r)
#pragma unroll
            for (int t = 0; t < kTokens; ++t) acc[r][t] = 0.0f;
        }
      }
    }
    cp_async_wait<0>();
    if (scaled) {
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        const auto row_of = [&] {
          return a.src_rows != nullptr ? int64_t{a.src_rows[pass_begin + t]} : int64_t{pass_begin + t};
        };
        const float v = t < pass_rows ? warp_sum(rms_share_sum<kThreads>(a.rms_scale, rms_stage[t], row_of)) : 0.0f;
        if (lane == 0) rms_sums[warp][t] = v;
      }
    }
    __syncthreads();
    float rms[kTokens];
#pragma unroll
    for (int t = 0; t < kTokens; ++t)
      rms[t] = scaled ? rms_scale_of<kWarps>(&rms_sums[0][t], kTokens, a.rms_scale) : 1.0f;
    // Outputs in row order, a quad's outputs adjacent; the warps' sums added in order.
    auto total = [&](int i, int r, int t) {
      float v = warp_sums[0][i][r][t];
#pragma unroll
      for (int q = 1; q < kWarps; ++q) v += warp_sums[q][i][r][t];
      return v;
    };
    if (res.x != nullptr) {
      // The residual form: a quad a thread, its four columns added to the residual, times the
      // norm's weight, and their squares as the quad's partial.
      for (int idx = tid; idx < pass_rows * k.num_quads; idx += kThreads) {
        const int t = idx / k.num_quads, i = idx % k.num_quads, q = first_quad + i;
        const int64_t at = (pass_begin + t) * a.ldy + q * kQuadRows;
        const float4 xv = idx == tid ? residual_stage[tid][0] : *reinterpret_cast<const float4*>(res.x + at);
        const float4 wv = idx == tid ? residual_stage[tid][1] : __ldg(reinterpret_cast<const float4*>(res.w) + q);
        const float row_scale = scaled ? scale_of_row(rms, t) : 1.0f;
        float sums[kQuadRows];
#pragma unroll
        for (int o = 0; o < kQuadRows; ++o) sums[o] = scaled ? total(i, o, t) * row_scale : total(i, o, t);
        store_residual_norm(res, at, (pass_begin + t) * (a.ldy / 4) + q, xv, wv, sums);
      }
      __syncthreads();  // the next pass reuses warp_sums
      continue;
    }
    const int outs_per_quad = gate_up ? 2 : kQuadRows;
    const int outs = k.num_quads * outs_per_quad;
    for (int idx = tid; idx < pass_rows * outs; idx += kThreads) {
      const int t = idx / outs, i = idx % outs / outs_per_quad, o = idx % outs_per_quad;
      const int64_t y_row = static_cast<int64_t>(pass_begin + t) * a.ldy;
      const float row_scale = scaled ? scale_of_row(rms, t) : 1.0f;
      if (gate_up) {
        const int out = (first_quad + i) * 2 + o;
        if (out >= a.n_out) continue;
        float g = total(i, 2 * o, t), u = total(i, 2 * o + 1, t);
        if (scaled) {
          g *= row_scale;
          u *= row_scale;
        }
        const float silu_up = g / (1.0f + expf(-g)) * u;
        if (a.epilogue == GemmEpilogue::kSiluMulF32) static_cast<float*>(a.y)[y_row + out] = silu_up;
        else static_cast<__nv_bfloat16*>(a.y)[y_row + out] = __float2bfloat16_rn(silu_up);
      } else {
        const int out = (first_quad + i) * kQuadRows + o;
        if (out >= a.n_out) continue;
        float v = total(i, o, t);
        if (scaled) v *= row_scale;
        static_cast<float*>(a.y)[y_row + out] = v;
      }
    }
    __syncthreads();  // the next pass reuses warp_sums
  }
}

}  // namespace dsinfer::cuda::few_row
