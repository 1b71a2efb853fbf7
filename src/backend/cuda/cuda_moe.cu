// MoE routing, planning and combination on the GPU: the launches around moe_routing.cuh's
// device code, the many-token planning kernels and the combine.
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/moe_combine.cuh"
#include "backend/cuda/moe_routing.cuh"
#include "backend/cuda/row_rms.cuh"
#include "backend/cuda/vector_load.cuh"

namespace dsinfer::cuda {
namespace {

using moe::count_entries;
using moe::expert_offsets;
using moe::kMaxExperts;
using moe::place_entries;

// One warp per token: routing is a handful of short reductions over at most a few hundred
// scores, and a prefill step routes tens of thousands of tokens.
constexpr int kRouteThreads = 32;

// One block (a warp) per token.
__global__ void __launch_bounds__(kRouteThreads) route_kernel(const float* logits, MoeRouteParams p,
                                                              const float* bias, int32_t* expert_ids,
                                                              float* weights) {
  await_previous_kernels();
  __shared__ moe::RouteScratch scratch;
  moe::route_token(logits, p, bias, blockIdx.x, scratch, expert_ids, weights);
}

__global__ void __launch_bounds__(moe::kLogitWarps * 32) router_logits_kernel(moe::RouterLogitsJob job) {
  moe::router_logits_block(job, blockIdx.x, blockIdx.y);
}

constexpr int kPlanThreads = 1024;
// Up to this many entries one block plans a step alone (one launch: decode). Beyond it each
// block takes a slice of this many entries, and three kernels count, offset and place.
constexpr int kPlanEntriesPerBlock = 4096;

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

__global__ void __launch_bounds__(kMoeRoutePlanMaxTokens * 32) route_plan_kernel(moe::RoutePlanJob job) {
  moe::route_plan_block(job);
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

// kWidth consecutive columns per thread (hidden and ld_expert multiples of kWidth, buffers
// aligned to kWidth elements); each column's sum runs in slot order, as the scalar version's.
// With r.x, the sums go to the residual and the norm's output before its 1 / rms instead of out.
template <typename T, int kWidth>
__global__ void combine_kernel(const T* expert_out, int64_t ld_expert, const int32_t* slot_row, const float* weights,
                               const float* shared, int64_t num_tokens, int top_k, int64_t hidden, float* out,
                               ResidualNormOutput r, int slots_at_once) {
  await_previous_kernels();
  const int64_t groups = hidden / kWidth;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= num_tokens * groups) return;
  moe::combine_columns<T, kWidth>(expert_out, ld_expert, slot_row, weights, shared, i / groups, top_k, hidden,
                                  (i % groups) * kWidth, out, r, slots_at_once);
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

// A warp per token (route_kernel), for steps of more than kMoeRoutePlanMaxTokens tokens.
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
                               Stream stream, bool one_warp_for_one_token) {
  moe::check_route_params(p);
  if (num_tokens == 0) return;
  if (num_tokens > kMoeRoutePlanMaxTokens) {
    launch_moe_route(logits, num_tokens, p, bias, expert_ids, weights, stream);
    launch_moe_plan(expert_ids, static_cast<int>(num_tokens * p.top_k), p.top_k, p.num_experts, rows_per_block,
                    row_offsets, block_offsets, src_rows, slot_rows, workspace, stream);
    return;
  }
  const moe::RoutePlanJob job{logits,        static_cast<int>(num_tokens), p,        bias,
                              expert_ids,    weights,                      rows_per_block, row_offsets,
                              block_offsets, src_rows,                     slot_rows, RowRmsScale{},
                              one_warp_for_one_token};
  launch_kernel(route_plan_kernel, 1, kMoeRoutePlanMaxTokens * 32, 0, stream, job);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_router_logits(const float* x, const float* gate, int64_t num_tokens, int hidden, int num_experts,
                          float* logits, Stream stream) {
  if (num_tokens == 0) return;
  DS_CHECK(num_tokens <= 0x7fffffff);
  const moe::RouterLogitsJob job{x, gate, hidden, num_experts, logits, num_tokens, RowRmsScale{}};
  const dim3 grid(static_cast<unsigned>(num_tokens), job.expert_blocks());
  launch_kernel(router_logits_kernel, grid, moe::kLogitWarps * 32, 0, stream, job);
  DS_CUDA_CHECK_LAUNCH();
}

int64_t moe_plan_workspace_ints(int num_entries, int num_experts) {
  if (num_entries <= kPlanEntriesPerBlock) return 0;
  return int64_t{(num_entries + kPlanEntriesPerBlock - 1) / kPlanEntriesPerBlock} * num_experts;
}


bool moe_combine_rows_in_fours(const MoeCombineRows& moe, int64_t hidden) {
  const size_t elem_bytes = moe.expert_out_bf16 ? 2 : 4;
  const auto aligned = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  return hidden % 4 == 0 && moe.ld_expert % 4 == 0 && aligned(moe.expert_out, 4 * elem_bytes) &&
         (moe.shared == nullptr || aligned(moe.shared, 16));
}

namespace {
void combine(const MoeCombineRows& moe, int64_t num_tokens, int64_t hidden, float* out, const ResidualNormOutput& r,
             Stream stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vectors = moe_combine_rows_in_fours(moe, hidden) &&
                       (r.x != nullptr ? aligned(r.x) && aligned(r.w) && aligned(r.out) : aligned(out));
  DS_CHECK_MSG(r.x == nullptr || vectors, "moe combine: the residual form reads and writes four columns at a time");
  const int width = vectors ? 4 : 1;
  const int64_t n = num_tokens * (hidden / width);
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  auto launch = [&](auto* typed_out) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(typed_out)>>;
    launch_kernel(vectors ? combine_kernel<T, 4> : combine_kernel<T, 1>, blocks, 256, 0, stream, typed_out,
                  moe.ld_expert, moe.slot_row, moe.weights, moe.shared, num_tokens, moe.top_k, hidden, out, r,
                  std::clamp(moe.slots_at_once, 1, kMoeCombineSlotsAtOnce));
  };
  if (moe.expert_out_bf16)
    launch(static_cast<const __nv_bfloat16*>(moe.expert_out));
  else
    launch(static_cast<const float*>(moe.expert_out));
  DS_CUDA_CHECK_LAUNCH();
}
}  // namespace

void launch_moe_combine(const MoeCombineRows& moe, int64_t num_tokens, int64_t hidden, float* out, Stream stream) {
  combine(moe, num_tokens, hidden, out, ResidualNormOutput{}, stream);
}

void launch_moe_combine_residual(const MoeCombineRows& moe, int64_t num_tokens, int64_t hidden,
                                 const ResidualNormOutput& r, Stream stream) {
  DS_CHECK(r.x != nullptr && r.w != nullptr && r.out != nullptr && r.out_bf16 != nullptr && r.partials != nullptr &&
           hidden % 128 == 0 && moe_combine_rows_in_fours(moe, hidden));
  combine(moe, num_tokens, hidden, nullptr, r, stream);
}

}  // namespace dsinfer::cuda
