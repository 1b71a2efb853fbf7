// The MoE routing's device code, shared by its own kernels (cuda_moe.cu) and by the kernels that
// run a short routing job and another product in one launch (moe_routing_beside.cu). Routing
// follows cpu::route_token exactly (same tie-breaking: lower expert index first) so that CPU and
// CUDA pick the same experts whenever the scores agree; a warp per token keeps a decode step's
// routing short.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/row_rms.cuh"
#include "backend/cuda/warp_sum.cuh"

namespace dsinfer::cuda::moe {

constexpr int kMaxExperts = 512;
constexpr int kMaxTopK = 32;

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

// The warp's best of its lanes' bests (every lane calls; all get the result).
__device__ __forceinline__ Best warp_best_of_lanes(Best best) {
  for (int off = 16; off > 0; off >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, best.v, off), __shfl_xor_sync(0xffffffffu, best.i, off)};
    best = better(best, other);
  }
  return best;
}

// The warp's best of the entries not yet taken (every lane calls; all get the result).
inline __device__ Best warp_best(const float* v, const bool* taken, int n, int lane) {
  Best best{0.0f, -1};
  for (int e = lane; e < n; e += 32)
    if (!taken[e]) best = better(best, Best{v[e], e});
  return warp_best_of_lanes(best);
}

// A warp's working space for routing one token (shared memory).
struct alignas(16) RouteScratch {  // 16-byte rows: route_plan_block stages float4 in one
  float score[kMaxExperts], choice[kMaxExperts], group[kMaxExperts];
  bool taken[kMaxExperts], group_taken[kMaxExperts], kept[kMaxExperts];
  int ids[kMaxTopK];
};

// Routes token t with one warp (every lane calls): scores, optional correction bias, group
// limit, top-k and weights, with the selection rules of cpu::route_token (the same experts
// whenever the scores agree).
inline __device__ void route_token(const float* logits, const MoeRouteParams& p, const float* bias, int64_t t,
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

// Whether the kernels take a routing of this shape (a DS_CHECK failure if not).
inline void check_route_params(const MoeRouteParams& p) {
  DS_CHECK_MSG(p.num_experts <= kMaxExperts && p.top_k <= kMaxTopK && p.top_k <= p.num_experts &&
                   p.num_groups >= 1 && p.num_experts % p.num_groups == 0 && p.topk_groups <= p.num_groups,
               "MoE routing shape beyond the CUDA kernel's limits");
}

// Four experts per block: a decode step of one token still spreads its 64 experts (V2-Lite)
// over 16 SMs.
constexpr int kLogitWarps = 4;

// Router logits in fp32 of num_tokens rows of x [num_tokens, hidden] by gate [num_experts,
// hidden] into logits [num_tokens, num_experts].
struct RouterLogitsJob {
  const float* x = nullptr;
  const float* gate = nullptr;
  int hidden = 0;
  int num_experts = 0;
  float* logits = nullptr;
  int64_t num_tokens = 0;
  // x holds a norm's output before each row's 1 / rms, which the logits then get (RowRmsScale).
  RowRmsScale rms_scale;
  // Non-null: added to each logit ([num_tokens, num_experts]; the part of the logits another
  // launch made, CudaBackend::RouterIdentity).
  const float* add = nullptr;
  // Blocks per token, kLogitWarps experts each.
  __host__ __device__ int expert_blocks() const { return (num_experts + kLogitWarps - 1) / kLogitWarps; }
};

// The job of one token's RouterLogitsRow (no norm's factor).
inline RouterLogitsJob one_token_job(const RouterLogitsRow& r) {
  DS_CHECK(r.x != nullptr && r.gate != nullptr && r.logits != nullptr && r.hidden > 0 && r.num_experts > 0);
  return RouterLogitsJob{r.x, r.gate, r.hidden, r.num_experts, r.logits, 1, RowRmsScale{}, r.add};
}

// Block (token t, expert_block) of the router logits: one warp per expert, lanes strided over
// the hidden size and a fixed shuffle tree, so a logit has the same bits whatever the batch. The
// loop is unrolled eight deep so that a lane's loads are in flight together (a hidden size of
// 2,048 is 16 float4 per lane). Blocks of kLogitWarps * 32 threads.
inline __device__ void router_logits_block(const RouterLogitsJob& job, int64_t t, int expert_block) {
  await_previous_kernels();
  // Where the logits get a norm's 1 / rms: this thread's share of its partial sums, in flight
  // while the warp reads x, and the block's sum after (row_rms.cuh).
  constexpr int kThreads = kLogitWarps * 32;
  const bool scaled = job.rms_scale.partials != nullptr;
  __shared__ float4 rms_stage[kThreads];
  if (scaled) {
    stage_rms_share<kThreads>(job.rms_scale, t, rms_stage);
    cp_async_commit();
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = expert_block * kLogitWarps + warp;
  const int hidden = job.hidden;
  float acc = 0.0f;
  if (e < job.num_experts) {
    const float* xr = job.x + t * hidden;
    const float* g = job.gate + static_cast<int64_t>(e) * hidden;
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
  }
  if (scaled) {  // the whole block alike
    __shared__ float rms_sums[kLogitWarps];
    cp_async_wait<0>();
    const float v = warp_sum(rms_share_sum<kThreads>(job.rms_scale, rms_stage, [t] { return t; }));
    if (lane == 0) rms_sums[warp] = v;
    __syncthreads();
    acc *= rms_scale_of<kLogitWarps>(rms_sums, 1, job.rms_scale);
  }
  if (lane == 0 && e < job.num_experts) {
    const int64_t i = t * job.num_experts + e;
    job.logits[i] = job.add != nullptr ? job.add[i] + acc : acc;
  }
}

// Block-wide helpers of the planning kernels (every thread calls them).
// counts[expert] += the entries in [begin, end) routed to it (counts in shared memory).
inline __device__ void count_entries(const int32_t* expert_ids, int begin, int end, int* counts) {
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) atomicAdd(&counts[expert_ids[i]], 1);
  __syncthreads();
}

// The experts' first rows and first GEMM row-blocks from their row counts; starts[e] (shared)
// gets expert e's first row too. The first warp scans 32 experts at a time with shuffles: a
// serial loop over the experts was a chain of some 64 dependent steps in every decode step.
inline __device__ void expert_offsets(const int* counts, int num_experts, int rows_per_block,
                                      int32_t* row_offsets, int32_t* block_offsets, int* starts) {
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
inline __device__ void place_entries(const int32_t* expert_ids, int begin, int end, int top_k, int* fill,
                                     int32_t* src_rows, int32_t* slot_rows) {
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const int row = atomicAdd(&fill[expert_ids[i]], 1);
    src_rows[row] = i / top_k;
    slot_rows[i] = row;
  }
}

// A step of up to kMoeRoutePlanMaxTokens tokens routes and plans in one block: a warp per token,
// then the block groups the entries as the many-token planning kernels do. In a decode step the
// routing and the planning are two latency-bound launches in a chain that leaves the memory
// idle; one launch takes a kernel boundary out of that chain.
//
// The job: routing of num_tokens rows of logits, the (token, slot) entries grouped by expert: row and
// row-block offsets per expert ([num_experts + 1] each), each row's token (src_rows) and each
// entry's row (slot_rows).
struct RoutePlanJob {
  const float* logits = nullptr;
  int num_tokens = 0;
  MoeRouteParams params;
  const float* bias = nullptr;
  int32_t* expert_ids = nullptr;
  float* weights = nullptr;
  int rows_per_block = 0;
  int32_t* row_offsets = nullptr;
  int32_t* block_offsets = nullptr;
  int32_t* src_rows = nullptr;
  int32_t* slot_rows = nullptr;
  // Non-null partials: the logits are of a norm's output before each row's 1 / rms, which the
  // block applies first (RowRmsScale).
  RowRmsScale rms_scale;
  // A step of one token whose routing one_warp_routes() takes runs route_plan_one_token (false:
  // the block's general path, for comparison).
  bool one_warp_for_one_token = true;
  // Who runs the one-warp routing beside a product once before its wait (moe_routing_beside.cu).
  RouteRehearsal rehearsal = RouteRehearsal::kNone;
};

// The one-token path's limits: a lane holds two experts' values, and no group limit.
constexpr int kOneWarpMaxExperts = 64;
__host__ __device__ inline bool one_warp_routes(int num_tokens, const MoeRouteParams& p) {
  return num_tokens == 1 && p.num_experts <= kOneWarpMaxExperts && (p.topk_method == 0 || p.num_groups == 1);
}

// A one-token step's routing and plan by one warp of the block, lane l holding experts l and l
// + 32 in registers (one_warp_routes): route_token's experts and weights and the block's plan,
// bit for bit, in a chain with one trip to memory (the logits, the correction bias and the
// norm's partials requested together) and no block barrier, where the general path makes two
// trips one after the other, passes five barriers, ranks over shared memory one float at a time
// and counts with shared atomics. The routed experts wait on this chain. choice_row
// [kOneWarpMaxExperts] (16-byte aligned) and ids [kMaxTopK]: its shared memory. A rehearsal runs
// the same instructions reading no memory and storing nothing but its shared rows, its values
// dropped (moe_routing_beside.cu).
inline __device__ void route_plan_one_token(const RoutePlanJob& job, float* choice_row, int* ids,
                                            bool rehearsal = false) {
  const MoeRouteParams& p = job.params;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int n = p.num_experts;
  const bool use_bias = p.topk_method == 2 && job.bias != nullptr;
  float logit[2], bias[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int e = lane + 32 * k;
    logit[k] = e < n && !rehearsal ? job.logits[e] : 0.0f;
    bias[k] = use_bias && e < n && !rehearsal ? job.bias[e] : 0.0f;
  }
  if (job.rms_scale.partials != nullptr) {
    RowRmsScale rms = job.rms_scale;
    if (rehearsal) rms.n = 0;  // no partials read (its factor is then NaN, and dropped)
    const float factor = rms_scale_by_one_warp<kMoeRoutePlanMaxTokens * 32>(rms, 0, lane);
    logit[0] *= factor;
    logit[1] *= factor;
  }
  float score[2] = {0.0f, 0.0f};
  if (!p.sigmoid) {
    Best best{0.0f, -1};
    for (int k = 0; k < 2; ++k)
      if (lane + 32 * k < n) best = better(best, Best{logit[k], lane + 32 * k});
    const float max_logit = warp_best_of_lanes(best).v;
    float part = 0.0f;
    for (int k = 0; k < 2; ++k)
      if (lane + 32 * k < n) {
        score[k] = expf(logit[k] - max_logit);
        part += score[k];
      }
    const float sum = warp_sum(part);
    score[0] /= sum;
    score[1] /= sum;
  } else {
    for (int k = 0; k < 2; ++k) score[k] = 1.0f / (1.0f + expf(-logit[k]));
  }
  // Choices past n read as NaN, which ranks before no expert.
  float choice[2];
  for (int k = 0; k < 2; ++k) {
    choice[k] = score[k] + bias[k];  // bias[k] is 0 without one, as route_token adds
    if (isnan(choice[k])) choice[k] = -INFINITY;
    choice_row[lane + 32 * k] = lane + 32 * k < n ? choice[k] : __int_as_float(0x7fc00000);
  }
  __syncwarp();
  // Ranks as route_token counts them, every lane reading all 64 choices. The loop over the
  // float4 is kept rolled: unrolled, its 128 compares were half the routing's code, which runs
  // once a layer and may be fetched from memory each time (moe_routing_beside.cu).
  int rank[2] = {0, 0};
#pragma unroll 1
  for (int j4 = 0; j4 < kOneWarpMaxExperts / 4; ++j4) {
    const float4 o4 = reinterpret_cast<const float4*>(choice_row)[j4];
    const float o[4] = {o4.x, o4.y, o4.z, o4.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int j = 4 * j4 + q;
#pragma unroll
      for (int k = 0; k < 2; ++k) rank[k] += (o[q] > choice[k] || (o[q] == choice[k] && j < lane + 32 * k)) ? 1 : 0;
    }
  }
  bool picked[2];
  for (int k = 0; k < 2; ++k) {
    picked[k] = lane + 32 * k < n && rank[k] < p.top_k;
    if (picked[k]) ids[rank[k]] = lane + 32 * k;
  }
  const unsigned picked_low = __ballot_sync(0xffffffffu, picked[0]);
  const unsigned picked_high = __ballot_sync(0xffffffffu, picked[1]);
  __syncwarp();
  // Slot `lane`'s expert and its score, from the lane that holds it.
  const int id = lane < p.top_k ? ids[lane] : 0;
  const float low = __shfl_sync(0xffffffffu, score[0], id & 31), high = __shfl_sync(0xffffffffu, score[1], id & 31);
  const float w = id < 32 ? low : high;
  float sum = 0.0f;  // in slot order, as route_token adds them
  for (int i = 0; i < p.top_k; ++i) sum += __shfl_sync(0xffffffffu, w, i);
  // Each pick is one row of one row-block, so an expert's first row and first block are the
  // number of picks before it.
  const auto picks_before = [&](int e) {
    const unsigned below = (1u << (e & 31)) - 1u;
    return e < 32 ? __popc(picked_low & below) : __popc(picked_low) + __popc(picked_high & below);
  };
  if (rehearsal) return;
  for (int k = 0; k < 2; ++k) {
    const int e = lane + 32 * k;
    if (e < n) job.row_offsets[e] = job.block_offsets[e] = picks_before(e);
  }
  if (lane == 0) job.row_offsets[n] = job.block_offsets[n] = p.top_k;
  if (lane < p.top_k) {
    const float scaled = p.norm_topk_prob && p.top_k > 1 ? w / (sum + 1e-20f) : w;
    job.expert_ids[lane] = id;
    job.weights[lane] = scaled * p.routed_scaling_factor;
    job.src_rows[lane] = 0;
    job.slot_rows[lane] = picks_before(id);
  }
}

// The one block of a route-and-plan job, of kMoeRoutePlanMaxTokens * 32 threads.
inline __device__ void route_plan_block(const RoutePlanJob& job) {
  await_previous_kernels();
  __shared__ RouteScratch scratch[kMoeRoutePlanMaxTokens];
  __shared__ int32_t entries[kMoeRoutePlanMaxTokens * kMaxTopK];
  __shared__ int counts[kMaxExperts];
  __shared__ int fill[kMaxExperts];
  const MoeRouteParams& p = job.params;
  if (job.one_warp_for_one_token && one_warp_routes(job.num_tokens, p)) {
    if (threadIdx.x < 32) route_plan_one_token(job, scratch[0].choice, scratch[0].ids);
    return;
  }
  const int warp = threadIdx.x / 32;
  for (int e = threadIdx.x; e < p.num_experts; e += blockDim.x) counts[e] = 0;
  // Row t's logits: the job's, or times the row's 1 / rms in scratch[t].choice, which route_token
  // reads each of before it writes it.
  const bool scaled = job.rms_scale.partials != nullptr;
  if (scaled) {
    // Rows of a norm's output before its factor: the whole block finishes each row's factor in
    // one order, as the products that apply it do. The stage is scratch[0].group's bytes, which
    // route_token writes only later.
    constexpr int kThreads = kMoeRoutePlanMaxTokens * 32;
    static_assert(sizeof(RouteScratch::group) >= kThreads * sizeof(float4), "the stage fits in a group row");
    auto* rms_stage = reinterpret_cast<float4*>(scratch[0].group);
    __shared__ float rms_sums[kMoeRoutePlanMaxTokens];
    const int lane = threadIdx.x % 32;
    for (int t = 0; t < job.num_tokens; ++t) {
      stage_rms_share<kThreads>(job.rms_scale, t, rms_stage);
      cp_async_commit();
      cp_async_wait<0>();
      const float v = warp_sum(rms_share_sum<kThreads>(job.rms_scale, rms_stage, [t] { return int64_t{t}; }));
      if (lane == 0) rms_sums[warp] = v;
      __syncthreads();  // every share read and every warp's sum written
      const float factor = rms_scale_of<kMoeRoutePlanMaxTokens>(rms_sums, 1, job.rms_scale);
      for (int e = threadIdx.x; e < p.num_experts; e += blockDim.x)
        scratch[t].choice[e] = job.logits[t * p.num_experts + e] * factor;
      __syncthreads();  // the factor read before the next row's sums and stage
    }
  }
  if (warp < job.num_tokens)
    route_token(scaled ? scratch[warp].choice : job.logits + int64_t{warp} * p.num_experts, p, job.bias, 0,
                scratch[warp], job.expert_ids + warp * p.top_k, job.weights + warp * p.top_k);
  __syncthreads();
  // The plan reads the chosen experts from the warps' scratch, not back from global memory.
  const int num_entries = job.num_tokens * p.top_k;
  for (int i = threadIdx.x; i < num_entries; i += blockDim.x) entries[i] = scratch[i / p.top_k].ids[i % p.top_k];
  __syncthreads();
  count_entries(entries, 0, num_entries, counts);
  expert_offsets(counts, p.num_experts, job.rows_per_block, job.row_offsets, job.block_offsets, fill);
  place_entries(entries, 0, num_entries, p.top_k, fill, job.src_rows, job.slot_rows);
}

}  // namespace dsinfer::cuda::moe
