// MoE routing, planning and combination on the GPU. Routing follows cpu::route_token exactly
// (same tie-breaking: lower expert index first) so that CPU and CUDA pick the same experts
// whenever the scores agree; a warp per token keeps a decode step's routing short.
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/kernel_launch.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kMaxExperts = 512;
constexpr int kMaxTopK = 32;

// One warp per token: routing is a handful of short reductions over at most a few hundred
// scores, and a prefill step routes tens of thousands of tokens.
constexpr int kRouteThreads = 32;

struct Best {
  float v;
  int i;
};
// The larger value wins; equal values go to the lower index (cpu::route_token's rule).
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.i < 0) return a;
  if (a.i < 0) return b;
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

// The warp's best of the entries not yet taken (every lane calls; all get the result).
__device__ Best warp_best(const float* v, const bool* taken, int n, int lane) {
  Best best{0.0f, -1};
  for (int e = lane; e < n; e += 32)
    if (!taken[e]) best = better(best, Best{v[e], e});
  for (int off = 16; off > 0; off >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, best.v, off), __shfl_xor_sync(0xffffffffu, best.i, off)};
    best = better(best, other);
  }
  return best;
}

__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// A warp's working space for routing one token (shared memory).
struct RouteScratch {
  float score[kMaxExperts], choice[kMaxExperts], group[kMaxExperts];
  bool taken[kMaxExperts], group_taken[kMaxExperts], kept[kMaxExperts];
  int ids[kMaxTopK];
};

// Routes token t with one warp (every lane calls): scores, optional correction bias, group
// limit, top-k and weights, with the selection rules of cpu::route_token (the same experts
// whenever the scores agree).
__device__ void route_token(const float* logits, const MoeRouteParams& p, const float* bias, int64_t t,
                            RouteScratch& s, int32_t* expert_ids, float* weights) {
  const int lane = threadIdx.x % 32;
  const int n = p.num_experts;
  const float* lg = logits + t * n;
  for (int e = lane; e < n; e += 32) s.taken[e] = false;
  __syncwarp();
  if (!p.sigmoid) {
    // The logits are read once, into the scores' place, and replaced there.
    for (int e = lane; e < n; e += 32) s.score[e] = lg[e];
    __syncwarp();
    const float max_logit = warp_best(s.score, s.taken, n, lane).v;
    float part = 0.0f;
    for (int e = lane; e < n; e += 32) {
      s.score[e] = expf(s.score[e] - max_logit);
      part += s.score[e];
    }
    const float sum = warp_sum(part);
    for (int e = lane; e < n; e += 32) s.score[e] /= sum;
  } else {
    for (int e = lane; e < n; e += 32) s.score[e] = 1.0f / (1.0f + expf(-lg[e]));
  }
  for (int e = lane; e < n; e += 32)
    s.choice[e] = s.score[e] + ((p.topk_method == 2 && bias != nullptr) ? bias[e] : 0.0f);
  __syncwarp();
  if (p.topk_method != 0 && p.num_groups > 1) {
    const int per_group = n / p.num_groups;
    for (int g = lane; g < p.num_groups; g += 32) {
      const float* c = s.choice + g * per_group;
      if (p.topk_method == 2) {  // noaux_tc: the sum of the group's top two
        int i0 = 0;
        for (int i = 1; i < per_group; ++i)
          if (c[i] > c[i0]) i0 = i;
        float second = 0.0f;
        if (per_group > 1) {
          int i1 = -1;
          for (int i = 0; i < per_group; ++i)
            if (i != i0 && (i1 < 0 || c[i] > c[i1])) i1 = i;
          second = c[i1];
        }
        s.group[g] = c[i0] + second;
      } else {  // group_limited_greedy: the group's best
        float mx = c[0];
        for (int i = 1; i < per_group; ++i) mx = fmaxf(mx, c[i]);
        s.group[g] = mx;
      }
      s.group_taken[g] = false;
      s.kept[g] = false;
    }
    __syncwarp();
    for (int i = 0; i < p.topk_groups; ++i) {
      const Best b = warp_best(s.group, s.group_taken, p.num_groups, lane);
      if (lane == 0) {
        s.group_taken[b.i] = true;
        s.kept[b.i] = true;
      }
      __syncwarp();
    }
    for (int e = lane; e < n; e += 32)
      if (!s.kept[e / per_group]) s.choice[e] = -INFINITY;
    __syncwarp();
  }
  // Top-k by rank: an expert's rank is the number of experts that come before it (a larger
  // choice, or an equal one at a lower index), so the experts of rank i < top_k are the picks in
  // the order the reference takes them. All lanes rank their experts at once instead of taking
  // the best top_k times in turn. A NaN choice ranks as -inf, so the ranks stay a permutation.
  for (int e = lane; e < n; e += 32)
    if (isnan(s.choice[e])) s.choice[e] = -INFINITY;
  __syncwarp();
  for (int e = lane; e < n; e += 32) {
    const float c = s.choice[e];
    int rank = 0;
    for (int j = 0; j < n; ++j) {
      const float other = s.choice[j];
      rank += (other > c || (other == c && j < e)) ? 1 : 0;
    }
    if (rank < p.top_k) s.ids[rank] = e;
  }
  __syncwarp();
  // The weights' sum in slot order (cpu::route_token's), then a lane per slot.
  float sum = 0.0f;
  if (lane == 0)
    for (int i = 0; i < p.top_k; ++i) sum += s.score[s.ids[i]];
  sum = __shfl_sync(0xffffffffu, sum, 0);
  if (lane < p.top_k) {
    float w = s.score[s.ids[lane]];
    if (p.norm_topk_prob && p.top_k > 1) w /= (sum + 1e-20f);
    expert_ids[t * p.top_k + lane] = s.ids[lane];
    weights[t * p.top_k + lane] = w * p.routed_scaling_factor;
  }
}

// One block (a warp) per token.
__global__ void __launch_bounds__(kRouteThreads) route_kernel(const float* logits, MoeRouteParams p,
                                                              const float* bias, int32_t* expert_ids,
                                                              float* weights) {
  await_previous_kernels();
  __shared__ RouteScratch scratch;
  route_token(logits, p, bias, blockIdx.x, scratch, expert_ids, weights);
}

// Four experts per block: a decode step of one token still spreads its 64 experts (V2-Lite)
// over 16 SMs.
constexpr int kLogitWarps = 4;

// Router logits in fp32: block (token, kLogitWarps experts), one warp per expert, lanes strided
// over the hidden size and a fixed shuffle tree, so a logit has the same bits whatever the batch.
// The loop is unrolled eight deep so that a lane's loads are in flight together (a hidden size
// of 2,048 is 16 float4 per lane).
__global__ void __launch_bounds__(kLogitWarps * 32) router_logits_kernel(const float* x, const float* gate,
                                                                         int hidden, int num_experts, float* logits) {
  await_previous_kernels();
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = blockIdx.y * kLogitWarps + warp;
  if (e >= num_experts) return;
  const float* xr = x + t * hidden;
  const float* g = gate + static_cast<int64_t>(e) * hidden;
  float acc = 0.0f;
  if (hidden % 4 == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const float4* g4 = reinterpret_cast<const float4*>(g);
#pragma unroll 8
    for (int i = lane; i < hidden / 4; i += 32) {
      const float4 a = x4[i], b = __ldg(g4 + i);
      acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
    }
  } else {
    for (int i = lane; i < hidden; i += 32) acc += xr[i] * g[i];
  }
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) logits[t * num_experts + e] = acc;
}

constexpr int kPlanThreads = 1024;
// Up to this many entries one block plans a step alone (one launch: decode). Beyond it each
// block takes a slice of this many entries, and three kernels count, offset and place.
constexpr int kPlanEntriesPerBlock = 4096;

// Block-wide helpers of the planning kernels (every thread calls them).
// counts[expert] += the entries in [begin, end) routed to it (counts in shared memory).
__device__ void count_entries(const int32_t* expert_ids, int begin, int end, int* counts) {
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) atomicAdd(&counts[expert_ids[i]], 1);
  __syncthreads();
}

// The experts' first rows and first GEMM row-blocks from their row counts; starts[e] (shared)
// gets expert e's first row too. The first warp scans 32 experts at a time with shuffles: a
// serial loop over the experts was a chain of some 64 dependent steps in every decode step.
__device__ void expert_offsets(const int* counts, int num_experts, int rows_per_block, int32_t* row_offsets,
                               int32_t* block_offsets, int* starts) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int rows_before = 0, blocks_before = 0;
    for (int base = 0; base < num_experts; base += 32) {
      const int e = base + lane;
      const int rows = e < num_experts ? counts[e] : 0;
      const int blocks = (rows + rows_per_block - 1) / rows_per_block;
      int rows_through = rows, blocks_through = blocks;  // inclusive sums over the 32
      for (int offset = 1; offset < 32; offset *= 2) {
        const int r = __shfl_up_sync(0xffffffffu, rows_through, offset);
        const int b = __shfl_up_sync(0xffffffffu, blocks_through, offset);
        if (lane >= offset) {
          rows_through += r;
          blocks_through += b;
        }
      }
      if (e < num_experts) {
        row_offsets[e] = rows_before + rows_through - rows;
        block_offsets[e] = blocks_before + blocks_through - blocks;
        starts[e] = rows_before + rows_through - rows;
      }
      rows_before += __shfl_sync(0xffffffffu, rows_through, 31);
      blocks_before += __shfl_sync(0xffffffffu, blocks_through, 31);
    }
    if (lane == 0) {
      row_offsets[num_experts] = rows_before;
      block_offsets[num_experts] = blocks_before;
    }
  }
  __syncthreads();
}

// Each entry of [begin, end) takes the next free row of its expert (fill, shared).
__device__ void place_entries(const int32_t* expert_ids, int begin, int end, int top_k, int* fill, int32_t* src_rows,
                              int32_t* slot_rows) {
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const int row = atomicAdd(&fill[expert_ids[i]], 1);
    src_rows[row] = i / top_k;
    slot_rows[i] = row;
  }
}

// Groups the (token, slot) entries by expert in one block: counts, offsets in rows and in GEMM
// row-blocks, then each entry's row. Rows within an expert land in any order; every row is
// computed on its own and the combine reads them by slot, so the result does not depend on it.
__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const int32_t* expert_ids, int num_entries, int top_k,
                                                            int num_experts, int rows_per_block, int32_t* row_offsets,
                                                            int32_t* block_offsets, int32_t* src_rows,
                                                            int32_t* slot_rows) {
  await_previous_kernels();
  __shared__ int counts[kMaxExperts];
  __shared__ int fill[kMaxExperts];
  for (int e = threadIdx.x; e < num_experts; e += kPlanThreads) counts[e] = 0;
  __syncthreads();
  count_entries(expert_ids, 0, num_entries, counts);
  expert_offsets(counts, num_experts, rows_per_block, row_offsets, block_offsets, fill);
  place_entries(expert_ids, 0, num_entries, top_k, fill, src_rows, slot_rows);
}

// A step of up to kRoutePlanMaxTokens tokens routes and plans in one block: a warp per token,
// then the block groups the entries as plan_kernel does. In a decode step the routing and the
// planning are two latency-bound launches in a chain that leaves the memory idle; one launch
// takes a kernel boundary out of that chain.
constexpr int kRoutePlanMaxTokens = 4;

__global__ void __launch_bounds__(kRoutePlanMaxTokens * 32) route_plan_kernel(
    const float* logits, int num_tokens, MoeRouteParams p, const float* bias, int32_t* expert_ids, float* weights,
    int rows_per_block, int32_t* row_offsets, int32_t* block_offsets, int32_t* src_rows, int32_t* slot_rows) {
  await_previous_kernels();
  __shared__ RouteScratch scratch[kRoutePlanMaxTokens];
  __shared__ int32_t entries[kRoutePlanMaxTokens * kMaxTopK];
  __shared__ int counts[kMaxExperts];
  __shared__ int fill[kMaxExperts];
  const int warp = threadIdx.x / 32;
  for (int e = threadIdx.x; e < p.num_experts; e += blockDim.x) counts[e] = 0;
  if (warp < num_tokens) route_token(logits, p, bias, warp, scratch[warp], expert_ids, weights);
  __syncthreads();
  // The plan reads the chosen experts from the warps' scratch, not back from global memory.
  const int num_entries = num_tokens * p.top_k;
  for (int i = threadIdx.x; i < num_entries; i += blockDim.x) entries[i] = scratch[i / p.top_k].ids[i % p.top_k];
  __syncthreads();
  count_entries(entries, 0, num_entries, counts);
  expert_offsets(counts, p.num_experts, rows_per_block, row_offsets, block_offsets, fill);
  place_entries(entries, 0, num_entries, p.top_k, fill, src_rows, slot_rows);
}

// Many entries, step 1: each block's per-expert counts of its slice, slice_rows [blocks][E].
__global__ void __launch_bounds__(kPlanThreads) plan_count_kernel(const int32_t* expert_ids, int num_entries,
                                                                  int num_experts, int32_t* slice_rows) {
  await_previous_kernels();
  __shared__ int counts[kMaxExperts];
  for (int e = threadIdx.x; e < num_experts; e += kPlanThreads) counts[e] = 0;
  __syncthreads();
  const int begin = blockIdx.x * kPlanEntriesPerBlock, end = min(begin + kPlanEntriesPerBlock, num_entries);
  count_entries(expert_ids, begin, end, counts);
  for (int e = threadIdx.x; e < num_experts; e += kPlanThreads) slice_rows[blockIdx.x * num_experts + e] = counts[e];
}

// Step 2, one block: the experts' row and row-block offsets, and slice_rows turned from counts
// into each slice's first row per expert (expert e's rows in slice order).
__global__ void __launch_bounds__(kPlanThreads) plan_offsets_kernel(int num_slices, int num_experts,
                                                                    int rows_per_block, int32_t* slice_rows,
                                                                    int32_t* row_offsets, int32_t* block_offsets) {
  await_previous_kernels();
  __shared__ int totals[kMaxExperts];
  __shared__ int starts[kMaxExperts];
  for (int e = threadIdx.x; e < num_experts; e += kPlanThreads) {
    int sum = 0;
    for (int b = 0; b < num_slices; ++b) {
      const int count = slice_rows[b * num_experts + e];
      slice_rows[b * num_experts + e] = sum;
      sum += count;
    }
    totals[e] = sum;
  }
  __syncthreads();
  expert_offsets(totals, num_experts, rows_per_block, row_offsets, block_offsets, starts);
  for (int e = threadIdx.x; e < num_experts; e += kPlanThreads)
    for (int b = 0; b < num_slices; ++b) slice_rows[b * num_experts + e] += starts[e];
}

// Step 3: each block places its slice's entries from its first rows on.
__global__ void __launch_bounds__(kPlanThreads) plan_fill_kernel(const int32_t* expert_ids, int num_entries, int top_k,
                                                                 int num_experts, const int32_t* slice_rows,
                                                                 int32_t* src_rows, int32_t* slot_rows) {
  await_previous_kernels();
  __shared__ int fill[kMaxExperts];
  for (int e = threadIdx.x; e < num_experts; e += kPlanThreads) fill[e] = slice_rows[blockIdx.x * num_experts + e];
  __syncthreads();
  const int begin = blockIdx.x * kPlanEntriesPerBlock, end = min(begin + kPlanEntriesPerBlock, num_entries);
  place_entries(expert_ids, begin, end, top_k, fill, src_rows, slot_rows);
}

__device__ void load_values(const float* p, float (&v)[1]) { v[0] = *p; }
__device__ void load_values(const float* p, float (&v)[4]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}
__device__ void load_values(const __nv_bfloat16* p, float (&v)[1]) { v[0] = __bfloat162float(*p); }
__device__ void load_values(const __nv_bfloat16* p, float (&v)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
}

// kWidth consecutive columns per thread (hidden and ld_expert multiples of kWidth, buffers
// aligned to kWidth elements); each column's sum runs in slot order, as the scalar version's.
template <typename T, int kWidth>
__global__ void combine_kernel(const T* expert_out, int64_t ld_expert, const int32_t* slot_row, const float* weights,
                               const float* shared, int64_t num_tokens, int top_k, int64_t hidden, float* out) {
  await_previous_kernels();
  const int64_t groups = hidden / kWidth;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= num_tokens * groups) return;
  const int64_t t = i / groups, c = (i % groups) * kWidth;
  float acc[kWidth] = {}, v[kWidth];
  for (int k = 0; k < top_k; ++k) {
    const float w = weights[t * top_k + k];
    load_values(expert_out + static_cast<int64_t>(slot_row[t * top_k + k]) * ld_expert + c, v);
    for (int j = 0; j < kWidth; ++j) acc[j] += w * v[j];
  }
  if (shared != nullptr) {
    load_values(shared + t * hidden + c, v);
    for (int j = 0; j < kWidth; ++j) acc[j] += v[j];
  }
  for (int j = 0; j < kWidth; ++j) out[t * hidden + c + j] = acc[j];
}

// One thread per chunk for the pointers, and per entry for its output row.
__global__ void moe_chunk_layout_kernel(MoeChunkLayout L) {
  await_previous_kernels();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < L.num_chunks) {
    // The expert whose chunks hold chunk i; chunks past the last expert's take expert 0.
    const bool used = i < L.chunk_offsets[L.num_experts];
    const int e = used ? owner_of(L.chunk_offsets, L.num_experts, i) : 0;
    const int64_t first_row = used ? L.row_offsets[e] + int64_t{i - L.chunk_offsets[e]} * L.chunk_rows : 0;
    const int64_t out_row = int64_t{i} * L.chunk_rows;
    void** p = L.pointers;
    const int n = L.num_chunks;
    p[0 * n + i] = const_cast<uint16_t*>(L.x + first_row * L.ld_x);
    // Expert e's weight, or its bf16 copy where the layer's e4m3 experts were widened.
    const auto weight = [e](const GemmWeight* table, const uint16_t* widened, int64_t stride) -> void* {
      return widened != nullptr ? const_cast<uint16_t*>(widened + e * stride) : const_cast<void*>(table[e].data);
    };
    p[1 * n + i] = weight(L.gate_up, L.gate_up_widened, L.gate_up_widened_stride);
    p[2 * n + i] = L.gate_up_out + out_row * L.ld_gate_up;
    p[3 * n + i] = L.act + out_row * L.ld_act;
    p[4 * n + i] = weight(L.down, L.down_widened, L.down_widened_stride);
    p[5 * n + i] = L.out + out_row * L.ld_out;
  }
  if (i < L.num_entries) {
    const int e = L.expert_ids[i];
    L.chunk_slot_rows[i] = L.chunk_offsets[e] * L.chunk_rows + (L.slot_rows[i] - L.row_offsets[e]);
  }
}

}  // namespace

void launch_moe_chunk_layout(const MoeChunkLayout& layout, Stream stream) {
  const int n = std::max(layout.num_chunks, layout.num_entries);
  if (n == 0) return;
  launch_kernel(moe_chunk_layout_kernel, (n + 255) / 256, 256, 0, stream, layout);
  DS_CUDA_CHECK_LAUNCH();
}

namespace {

void check_route_params(const MoeRouteParams& p) {
  DS_CHECK_MSG(p.num_experts <= kMaxExperts && p.top_k <= kMaxTopK && p.top_k <= p.num_experts &&
                   p.num_groups >= 1 && p.num_experts % p.num_groups == 0 && p.topk_groups <= p.num_groups,
               "MoE routing shape beyond the CUDA kernel's limits");
}

// A warp per token (route_kernel), for steps of more than kRoutePlanMaxTokens tokens.
void launch_moe_route(const float* logits, int64_t num_tokens, const MoeRouteParams& p, const float* bias,
                      int32_t* expert_ids, float* weights, Stream stream) {
  DS_CHECK(num_tokens <= 0x7fffffff);
  launch_kernel(route_kernel, static_cast<unsigned>(num_tokens), kRouteThreads, 0, stream, logits, p, bias, expert_ids,
                weights);
  DS_CUDA_CHECK_LAUNCH();
}

// The grouping of launch_moe_route's entries: one block up to kPlanEntriesPerBlock entries,
// else count, offset and fill over slices.
void launch_moe_plan(const int32_t* expert_ids, int num_entries, int top_k, int num_experts, int rows_per_block,
                     int32_t* row_offsets, int32_t* block_offsets, int32_t* src_rows, int32_t* slot_rows,
                     int32_t* workspace, Stream stream) {
  if (num_entries <= kPlanEntriesPerBlock) {
    launch_kernel(plan_kernel, 1, kPlanThreads, 0, stream, expert_ids, num_entries, top_k, num_experts,
                  rows_per_block, row_offsets, block_offsets, src_rows, slot_rows);
    DS_CUDA_CHECK_LAUNCH();
    return;
  }
  DS_CHECK_MSG(workspace != nullptr, "MoE plan: " << num_entries << " entries need a workspace");
  const int num_slices = (num_entries + kPlanEntriesPerBlock - 1) / kPlanEntriesPerBlock;
  launch_kernel(plan_count_kernel, num_slices, kPlanThreads, 0, stream, expert_ids, num_entries, num_experts,
                workspace);
  DS_CUDA_CHECK_LAUNCH();
  launch_kernel(plan_offsets_kernel, 1, kPlanThreads, 0, stream, num_slices, num_experts, rows_per_block, workspace,
                row_offsets, block_offsets);
  DS_CUDA_CHECK_LAUNCH();
  launch_kernel(plan_fill_kernel, num_slices, kPlanThreads, 0, stream, expert_ids, num_entries, top_k, num_experts,
                static_cast<const int32_t*>(workspace), src_rows, slot_rows);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_moe_route_and_plan(const float* logits, int64_t num_tokens, const MoeRouteParams& p, const float* bias,
                               int32_t* expert_ids, float* weights, int rows_per_block, int32_t* row_offsets,
                               int32_t* block_offsets, int32_t* src_rows, int32_t* slot_rows, int32_t* workspace,
                               Stream stream) {
  check_route_params(p);
  if (num_tokens == 0) return;
  if (num_tokens > kRoutePlanMaxTokens) {
    launch_moe_route(logits, num_tokens, p, bias, expert_ids, weights, stream);
    launch_moe_plan(expert_ids, static_cast<int>(num_tokens * p.top_k), p.top_k, p.num_experts, rows_per_block,
                    row_offsets, block_offsets, src_rows, slot_rows, workspace, stream);
    return;
  }
  launch_kernel(route_plan_kernel, 1, kRoutePlanMaxTokens * 32, 0, stream, logits, static_cast<int>(num_tokens), p,
                bias, expert_ids, weights, rows_per_block, row_offsets, block_offsets, src_rows, slot_rows);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_router_logits(const float* x, const float* gate, int64_t num_tokens, int hidden, int num_experts,
                          float* logits, Stream stream) {
  if (num_tokens == 0) return;
  DS_CHECK(num_tokens <= 0x7fffffff);
  const dim3 grid(static_cast<unsigned>(num_tokens), (num_experts + kLogitWarps - 1) / kLogitWarps);
  launch_kernel(router_logits_kernel, grid, kLogitWarps * 32, 0, stream, x, gate, hidden, num_experts, logits);
  DS_CUDA_CHECK_LAUNCH();
}

int64_t moe_plan_workspace_ints(int num_entries, int num_experts) {
  if (num_entries <= kPlanEntriesPerBlock) return 0;
  return int64_t{(num_entries + kPlanEntriesPerBlock - 1) / kPlanEntriesPerBlock} * num_experts;
}


void launch_moe_combine(const void* expert_out, bool expert_out_bf16, int64_t ld_expert, const int32_t* slot_row,
                        const float* weights, const float* shared, int64_t num_tokens, int top_k, int64_t hidden,
                        float* out, Stream stream) {
  const size_t elem_bytes = expert_out_bf16 ? 2 : 4;
  const auto aligned = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  const bool vectors = hidden % 4 == 0 && ld_expert % 4 == 0 && aligned(expert_out, 4 * elem_bytes) &&
                       aligned(out, 16) && (shared == nullptr || aligned(shared, 16));
  const int width = vectors ? 4 : 1;
  const int64_t n = num_tokens * (hidden / width);
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  auto launch = [&](auto* typed_out) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(typed_out)>>;
    launch_kernel(vectors ? combine_kernel<T, 4> : combine_kernel<T, 1>, blocks, 256, 0, stream, typed_out, ld_expert,
                  slot_row, weights, shared, num_tokens, top_k, hidden, out);
  };
  if (expert_out_bf16)
    launch(static_cast<const __nv_bfloat16*>(expert_out));
  else
    launch(static_cast<const float*>(expert_out));
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
