// A one-token step's routed down product in which each block takes a few quads of output columns
// of every routed expert, and then combines them itself: the experts' rows for its columns are
// in its shared memory, so the MoE combine needs no other block's results and no trip through
// L2 (few_row_gemm_combine.cu's blocks each take one expert's quads, and the last of a column
// slice's blocks to arrive at a counter combines the slice).
//
// The walk is gemm_block's (few_row_gemm.cuh) for passes of one fp32 row over a fixed phase
// count, continued across the experts: step s is phase s % P of quad (s / P) % U of row-block
// s / (P · U), kDepth steps in flight per thread across the experts' boundaries, the first
// requested before the wait. Every expert's sums run in gemm_block's order, its warps' sums
// added in order, and the combine's slot sums are combine_columns' (moe_combine.cuh), so the
// outputs are the bits of the down product and the combine launched apart.
//
// What it costs: every block reads every expert's x row (the SiLU·up row in fp32, 5.6 KB for
// V2-Lite's 1,408 columns), where a block of one expert reads one; quads per block above one
// divide that.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/few_row_form.cuh"
#include "backend/cuda/few_row_gemm.cuh"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/moe_combine.cuh"
#include "backend/cuda/tensor_core.cuh"

namespace dsinfer::cuda {
namespace {

using few_row::kDepth;
using few_row::kQuadRows;
using few_row::kThreads;
using few_row::kWarps;

constexpr int kMaxSlots = kMaxDownCombineSlots;  // routed rows of the token (top_k), row-blocks
constexpr int kMaxQuads = kMaxDownCombineQuads;  // quads of a block

struct WalkJob {
  MoeCombineRows rows;
  ResidualNormOutput out;
  int64_t hidden = 0;
  int max_row_blocks = 0;  // at most kMaxSlots
};

// The token's row-blocks: each routed expert's weight and its row (one row a row-block).
struct RowBlocks {
  const char* data[kMaxSlots];
  const float* scales[kMaxSlots];
  int row[kMaxSlots];
  int count;
  int k_padded, n_padded;
};

// By one warp: grouped_row_block_warp's search for row-blocks 0, 1, … up to the first past the
// layout's end, the group offsets read once for all of them.
__device__ __forceinline__ void find_row_blocks(const GroupedGemmArgs& a, int max_row_blocks, RowBlocks& out) {
  const int lane = threadIdx.x % 32;
  int32_t offsets[kWarpSearchLoads];
  load_block_offsets_warp(a, offsets);
  int my_group = 0, count = 0;  // lane b: row-block b's group
#pragma unroll
  for (int b = 0; b < kMaxSlots; ++b) {
    if (b >= max_row_blocks) break;
    const int group = group_of_block_warp(a, offsets, b);
    if (group < 0) break;
    if (lane == b) my_group = group;
    count = b + 1;
  }
  if (lane < count) {
    const GemmWeight w = a.groups[my_group];
    out.data[lane] = static_cast<const char*>(w.data);
    out.scales[lane] = w.scales;
    out.row[lane] = __ldcg(a.row_offsets + my_group) + (lane - __ldcg(a.block_offsets + my_group)) * a.rows_per_block;
    if (lane == 0) {
      out.k_padded = w.k_padded;
      out.n_padded = w.n_padded;
    }
  }
  if (lane == 0) out.count = count;
}

// kFp8: e4m3 weights, multiplied in f16 pairs against x's pieces as scaled_halves_of_f32x16 makes
// them; else bf16 weights against x's fp32. kPhases: 1 or 2 (few_row::fixed_phases).
template <bool kFp8, int kPhases>
__global__ void __launch_bounds__(kThreads, 4)
    down_combine_walk_kernel(GroupedGemmArgs a, int quads_per_block, WalkJob job) {
  constexpr int kPieceElems = kFp8 ? 16 : 8;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int first_quad = blockIdx.x * quads_per_block;
  __shared__ RowBlocks blocks;
  __shared__ float warp_sums[kWarps][kMaxSlots][kMaxQuads][kQuadRows];
  __shared__ float values[kMaxSlots][kMaxQuads * kQuadRows];  // by output row: the experts' sums
  __shared__ float4 stage[kMaxQuads][3];                      // a quad's residual, norm weight, shared row
  __shared__ int32_t slot_row[kMaxSlots];
  __shared__ float slot_weight[kMaxSlots];
  // Each thread's x pieces: [row-block][phase][2][kThreads] (f16 pairs or fp32 words), and for
  // e4m3 weights the inverse of each piece pair's scale, [row-block][phase][kThreads].
  extern __shared__ uint4 x_pieces[];
  // The layout was written two launches back (the gate/up product is the launch between).
  if (warp == 0) find_row_blocks(a, job.max_row_blocks, blocks);
  __syncthreads();
  const int count = blocks.count, k_padded = blocks.k_padded;
  const int num_quads = max(0, min(quads_per_block, blocks.n_padded / kQuadRows - first_quad));
  const int64_t row_bytes = kFp8 ? k_padded : 2 * int64_t{k_padded};
  const int num_pieces = k_padded / kPieceElems;
  const int steps_per_block = num_quads * kPhases, num_steps = count * steps_per_block;
  const StepDivisor row_block_of(steps_per_block);
  const uint64_t policy = weight_l2_policy(a.weights_evict_first);
  uint4 pieces[kDepth][kQuadRows];
  auto issue = [&](int s, uint4(&dst)[kQuadRows]) {
    const int b = row_block_of.quotient(s), within = s - b * steps_per_block;
    const int p = within % kPhases * kThreads + tid;
    const bool valid = s < num_steps && p < num_pieces;
    const char* first = blocks.data[valid ? b : 0] + p * 16 + (first_quad + within / kPhases) * kQuadRows * row_bytes;
#pragma unroll
    for (int r = 0; r < kQuadRows; ++r)
      dst[r] = valid ? load_weight_piece(first + r * row_bytes, policy) : make_uint4(0, 0, 0, 0);
  };
#pragma unroll
  for (int d = 0; d < kDepth; ++d) issue(d, pieces[d]);
  await_previous_kernels();
  if (num_steps == 0) return;

  // The combine's reads, in flight through the walk: the routing's slots, and each quad's
  // residual, norm weight and shared experts' row.
  const int64_t first_col = int64_t{first_quad} * kQuadRows;
  if (tid < job.rows.top_k) {
    slot_row[tid] = job.rows.slot_row[tid];
    slot_weight[tid] = job.rows.weights[tid];
  }
  if (tid < num_quads && first_col + kQuadRows * tid < job.hidden) {
    const int64_t c = first_col + kQuadRows * tid;
    cp_async16(&stage[tid][0], job.out.x + c, true);
    cp_async16(&stage[tid][1], job.out.w + c, true);
    cp_async16(&stage[tid][2], job.rows.shared != nullptr ? job.rows.shared + c : job.out.w + c,
               job.rows.shared != nullptr);
  }
  cp_async_commit();

  // This thread's x pieces of every row-block, as gemm_block holds them for one.
  uint4* x_words = x_pieces;
  float* x_unscale = reinterpret_cast<float*>(x_pieces + count * kPhases * 2 * kThreads);
#pragma unroll
  for (int b = 0; b < kMaxSlots; ++b) {
    if (b >= count) break;
    const float* x = a.x_f32 + int64_t{blocks.row[b]} * a.ldx_f32;
#pragma unroll
    for (int ph = 0; ph < kPhases; ++ph) {
      const int p = ph * kThreads + tid;
      uint4* dst = x_words + ((b * kPhases + ph) * 2) * kThreads + tid;
      if constexpr (kFp8) {
        uint4 v[4];
#pragma unroll
        for (int h = 0; h < 2; ++h)
          few_row::load_f32_piece(p * kPieceElems + 8 * h < a.x_f32_cols, x + p * kPieceElems + 8 * h, v[2 * h],
                                  v[2 * h + 1]);
        uint4 half_a, half_b;
        x_unscale[(b * kPhases + ph) * kThreads + tid] = few_row::scaled_halves_of_f32x16(v, half_a, half_b);
        dst[0] = half_a;
        dst[kThreads] = half_b;
      } else {
        uint4 lo, hi;
        few_row::load_f32_piece(p * kPieceElems < a.x_f32_cols, x + p * kPieceElems, lo, hi);
        dst[0] = lo;
        dst[kThreads] = hi;
      }
    }
  }

  const int scale_cols = (k_padded + kScaleCols - 1) / kScaleCols;
  float acc[kQuadRows] = {};
  for (int s0 = 0; s0 < num_steps; s0 += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int s = s0 + d;
      if (s >= num_steps) break;
      const int b = row_block_of.quotient(s), within = s - b * steps_per_block;
      const int i = within / kPhases, phase = within % kPhases;
      const int p = phase * kThreads + tid;
      if (p < num_pieces) {
        const uint4* xp = x_words + ((b * kPhases + phase) * 2) * kThreads + tid;
        const uint4 xa = xp[0], xb = xp[kThreads];
        if constexpr (kFp8) {
          const float unscale = x_unscale[(b * kPhases + phase) * kThreads + tid];
#pragma unroll
          for (int r = 0; r < kQuadRows; ++r) {
            const uint32_t words[4] = {pieces[d][r].x, pieces[d][r].y, pieces[d][r].z, pieces[d][r].w};
            __half2 w_halves[8];
#pragma unroll
            for (int j = 0; j < 8; ++j)
              w_halves[j] = few_row::half2_of_e4m3x2(j % 2 == 0 ? words[j / 2] : words[j / 2] >> 16);
            const int row = (first_quad + i) * kQuadRows + r;
            const float scale = blocks.scales[b][(row / 16) * scale_cols + p * kPieceElems / kScaleCols];
            const float sum = few_row::dot_e4m3x16_halves(w_halves, xa, xb);
            acc[r] = fmaf(sum, scale * unscale, acc[r]);
          }
        } else {
          const uint32_t words[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
          float xf[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) xf[e] = __uint_as_float(words[e]);
#pragma unroll
          for (int r = 0; r < kQuadRows; ++r) {
            float wf[8];
            few_row::widen_bf16x8(pieces[d][r], wf);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r] = fmaf(wf[e], xf[e], acc[r]);
          }
        }
      }
      issue(s + kDepth, pieces[d]);
      if (phase == kPhases - 1) {
        // The quad's warp sums, as gemm_block adds them (the same butterfly, the same bits).
        const bool upper16 = (lane & 16) != 0, upper8 = (lane & 8) != 0;
        const float kept0 = (upper16 ? acc[2] : acc[0]) + __shfl_xor_sync(0xffffffffu, upper16 ? acc[0] : acc[2], 16);
        const float kept1 = (upper16 ? acc[3] : acc[1]) + __shfl_xor_sync(0xffffffffu, upper16 ? acc[1] : acc[3], 16);
        float v = (upper8 ? kept1 : kept0) + __shfl_xor_sync(0xffffffffu, upper8 ? kept0 : kept1, 8);
#pragma unroll
        for (int offset = 4; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
        if (lane % 8 == 0) warp_sums[warp][b][i][lane / 8] = v;
#pragma unroll
        for (int r = 0; r < kQuadRows; ++r) acc[r] = 0.0f;
      }
    }
  }
  __syncthreads();
  // Each expert's outputs, its warps' sums added in order, by the row the combine reads.
  for (int idx = tid; idx < count * num_quads * kQuadRows; idx += kThreads) {
    const int b = idx / (num_quads * kQuadRows), iq = idx % (num_quads * kQuadRows);
    const int i = iq / kQuadRows, o = iq % kQuadRows;
    float v = warp_sums[0][b][i][o];
#pragma unroll
    for (int q = 1; q < kWarps; ++q) v += warp_sums[q][b][i][o];
    values[blocks.row[b]][iq] = v;
  }
  cp_async_wait<0>();
  __syncthreads();
  // The combine of a quad's four columns a thread.
  const int64_t c = first_col + kQuadRows * tid;
  if (tid >= num_quads || c >= job.hidden) return;
  float sums[kQuadRows] = {};
  moe::add_weighted_slots<kQuadRows>(
      slot_row, slot_weight, job.rows.top_k, job.rows.slots_at_once,
      [&](int64_t row, float(&v)[kQuadRows]) {
#pragma unroll
        for (int j = 0; j < kQuadRows; ++j) v[j] = values[row][kQuadRows * tid + j];
      },
      sums);
  if (job.rows.shared != nullptr) {
    const float4 shared_v = stage[tid][2];
    sums[0] += shared_v.x;
    sums[1] += shared_v.y;
    sums[2] += shared_v.z;
    sums[3] += shared_v.w;
  }
  store_residual_norm(job.out, c, c / kQuadRows, stage[tid][0], stage[tid][1], sums);
}

template <bool kFp8, int kPhases>
void launch_walk(const GroupedGemmArgs& a, int max_n_padded, const WalkJob& job, int quads_per_block, Stream stream) {
  constexpr auto kernel = down_combine_walk_kernel<kFp8, kPhases>;
  const int slots = job.max_row_blocks;
  const size_t shared_bytes = size_t{16} * slots * kPhases * 2 * kThreads + (kFp8 ? 4 * slots * kPhases * kThreads : 0);
  allow_shared_bytes<kernel>(few_row::kMmaMaxSharedBytes + 32 * 1024);
  const int num_quads = max_n_padded / kQuadRows;
  // One wave: the quads spread over the resident blocks, unless asked for.
  if (quads_per_block <= 0) {
    const int capacity = few_row::resident_blocks<kernel>(shared_bytes);
    quads_per_block = std::clamp((num_quads + capacity - 1) / capacity, 1, kMaxQuads);
  }
  quads_per_block = std::min(quads_per_block, kMaxQuads);
  const dim3 grid((num_quads + quads_per_block - 1) / quads_per_block);
  launch_kernel(kernel, grid, kThreads, shared_bytes, stream, a, quads_per_block, job);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool few_row_down_combine_fits(const GroupedGemmArgs& a, int max_row_blocks, const MoeCombineRows& rows,
                               int64_t hidden) {
  const int phases = few_row::fixed_phases(a.ldx, a.weights_fp8, 2, 2);
  return a.groups != nullptr && a.x_f32 != nullptr && a.few_row_fixed_phases && (phases == 1 || phases == 2) &&
         !(a.weights_fp8 && a.few_row_mma) && a.layout_before_wait && a.num_groups <= kWarpSearchGroups &&
         a.src_rows == nullptr && a.rms_scale.partials == nullptr && a.residual_norm.x == nullptr &&
         a.epilogue == GemmEpilogue::kStoreF32 && a.k_splits == 1 && max_row_blocks >= 1 &&
         max_row_blocks <= kMaxSlots && rows.top_k >= 1 && rows.top_k <= kMaxSlots && !rows.expert_out_bf16 &&
         hidden % 128 == 0 && moe_combine_rows_in_fours(rows, hidden) && a.ldx_f32 % 4 == 0 &&
         a.x_f32_cols % 8 == 0 && a.ldx < kStepDivisorMaxK;
}

void launch_few_row_down_combine(const GroupedGemmArgs& a, int max_n_padded, int max_row_blocks,
                                 const MoeCombineRows& rows, int64_t hidden, const ResidualNormOutput& out,
                                 int quads_per_block, Stream stream) {
  DS_CHECK_MSG(few_row_down_combine_fits(a, max_row_blocks, rows, hidden),
               "the down product with the combine in its blocks: a one-token step's fixed-phase walk");
  DS_CHECK(max_n_padded % kGemmTileRows == 0 && max_n_padded >= hidden && out.x != nullptr && out.w != nullptr &&
           out.out != nullptr && out.out_bf16 != nullptr && out.partials != nullptr);
  WalkJob job{rows, out, hidden, max_row_blocks};
  job.rows.slots_at_once = std::clamp(rows.slots_at_once, 1, kMoeCombineSlotsAtOnce);
  const int phases = few_row::fixed_phases(a.ldx, a.weights_fp8, 2, 2);
  if (a.weights_fp8) {
    if (phases == 1) launch_walk<true, 1>(a, max_n_padded, job, quads_per_block, stream);
    else launch_walk<true, 2>(a, max_n_padded, job, quads_per_block, stream);
  } else {
    if (phases == 1) launch_walk<false, 1>(a, max_n_padded, job, quads_per_block, stream);
    else launch_walk<false, 2>(a, max_n_padded, job, quads_per_block, stream);
  }
}

}  // namespace dsinfer::cuda
