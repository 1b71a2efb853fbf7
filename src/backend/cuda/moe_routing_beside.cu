// The MoE routing's two short launches of a small step, each with a dense few-row product in the
// blocks after its own: the layer's shared experts, gate/up beside the router logits and down
// beside the routing and planning.
//
// Why: at batch 1 the router logits and the one-block routing and planning read almost nothing,
// yet they are two links of the layer's chain, a few µs each, while the shared experts (35 MB of
// V2-Lite's weights per layer) depend on the layer's input alone. With the shared experts on a
// second stream beside them, the routed experts started 19 µs after the router logits ended,
// where the routing alone takes 6 µs. In the same launches the shared experts' weights stream in
// while the routing runs, and the combine finds their output ready. The product's blocks are those of
// few_row_gemm.cu, so its output has the bits of the product launched alone.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/few_row_form.cuh"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/moe_routing.cuh"

namespace dsinfer::cuda {
namespace {

static_assert(moe::kLogitWarps * 32 == few_row::kThreads && kMoeRoutePlanMaxTokens * 32 == few_row::kThreads,
              "the jobs that share a launch run on blocks of one size");

// Blocks [0, tokens x expert blocks): the router logits; the rest: the product's.
template <typename Form>
__global__ void __launch_bounds__(few_row::kThreads, Form::kMinBlocksPerSm)
    router_logits_beside_kernel(moe::RouterLogitsJob logits, GroupedGemmArgs product, int units_per_block) {
  const int expert_blocks = logits.expert_blocks();
  const int logit_blocks = static_cast<int>(logits.num_tokens) * expert_blocks;
  const int b = static_cast<int>(blockIdx.x);
  if (b < logit_blocks) moe::router_logits_block(logits, b / expert_blocks, b % expert_blocks);
  else Form::run(product, units_per_block, b - logit_blocks, 0);
}

// Block 0: the routing and planning; the rest: the product's.
template <typename Form>
__global__ void __launch_bounds__(few_row::kThreads, Form::kMinBlocksPerSm)
    route_plan_beside_kernel(moe::RoutePlanJob plan, GroupedGemmArgs product, int units_per_block) {
  if (blockIdx.x == 0) moe::route_plan_block(plan);
  else Form::run(product, units_per_block, static_cast<int>(blockIdx.x) - 1, 0);
}

// Block 0: a one-token routing and plan in one warp (moe::one_warp_routes), whose shared memory
// is its choice row and picks alone; the rest: the product's. Every block of a launch reserves
// the kernel's static shared memory, route_plan_block's scratch included (44 KB a block with the
// product's, 8.6 KB here): with e4m3 weights this launch made batch-1 decode 0.8% faster on an
// H100, with bf16 ones no faster (bench/RESULTS.md).
//
// The rehearsal (opt-in, RoutePlanJob::rehearsal): the block took 10–14 µs after its
// wait on an H100, for one trip to memory and about 2 µs of arithmetic, and held the launch open
// (bench/RESULTS.md). The reading it rests on: the routing runs once a layer in one warp, and a
// layer's weights pass through L2 between two runs, so its instructions come from DRAM behind
// the product's requests, one fetch after another. Run once before the wait, reading nothing
// and storing nothing, it has them fetched while the launch before drains. Measured on an H100,
// the reading holds (the block done 4.4 µs after its wait instead of 11.3), yet batch-1 decode
// was 3.5% slower with e4m3 weights and no faster with bf16 ones, so it stays off. Why: this
// launch's blocks are scheduled only as the launch before (o_proj and the router logits, four
// blocks an SM, as many as fit) lets them, so the rehearsal, itself run on cold code,
// starts as that launch's 5 µs of work do and ends some 6 µs after them, and the wait returns
// that much later (kernel timeline: that launch 4.9 → 11.3 µs, this one 8.2 → 4.9). Keeping a
// block's room free in that launch and letting this one be scheduled as it starts shortened the
// overrun to 1.3 µs, yet the step was 1.7% slower, as it was with those two changes alone. A
// second warp of the block rehearsing while the routing's warp waits (RouteRehearsal::kBesideWarp)
// holds nothing back: the routing block was done 1.3–1.5 µs sooner after its wait on an H100,
// but the launch only 0.3–0.8 µs sooner, held open by the product's blocks, which start as the
// launch before leaves them room, and batch-1 decode was no faster.
template <typename Form>
__global__ void __launch_bounds__(few_row::kThreads, Form::kMinBlocksPerSm)
    route_plan_one_warp_beside_kernel(moe::RoutePlanJob plan, GroupedGemmArgs product, int units_per_block) {
  if (blockIdx.x == 0) {
    // Warp 0 routes; with RouteRehearsal::kBesideWarp, warp 1 rehearses beside it in rows of its own.
    __shared__ __align__(16) float choice_row[2][moe::kOneWarpMaxExperts];
    __shared__ int ids[2][moe::kMaxTopK];
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const bool rehearses_beside = plan.rehearsal == RouteRehearsal::kBesideWarp && warp == 1;
    // Pass 0, warp 0's rehearsal, and pass 1, the routing after the wait or warp 1's rehearsal
    // before it, run one copy of the code (a loop kept rolled; a function kept out of line took
    // the job by a pointer to a copy in local memory).
    KernelTimelineEntry timed;
#pragma unroll 1
    for (int pass = plan.rehearsal == RouteRehearsal::kSameWarp ? 0 : 1; pass < 2; ++pass) {
      const bool rehearsal = pass == 0 || rehearses_beside;
      if (!rehearsal) timed = await_previous_kernels();
      if (warp == 0 || rehearses_beside)
        moe::route_plan_one_token(plan, choice_row[warp & 1], ids[warp & 1], rehearsal);
    }
    if (rehearses_beside) await_previous_kernels();
    note_first_block_done(timed);
  } else {
    Form::run(product, units_per_block, static_cast<int>(blockIdx.x) - 1, 0);
  }
}

// job_blocks of the job, then the product's blocks, sized as few_row_gemm.cu sizes them for one
// wave of what the job leaves of the GPU.
template <auto Kernel, typename Form, typename Job>
void launch_one(const Job& job, int job_blocks, const GroupedGemmArgs& product, Stream stream) {
  const size_t shared_bytes = Form::shared_bytes(product);
  Form::template allow_shared_memory<Kernel>();
  const int num_units = product.dense.n_padded / Form::kUnitRows;
  const int64_t capacity = std::max<int64_t>(1, few_row::resident_blocks<Kernel>(shared_bytes) - job_blocks);
  const int units_per_block = few_row::units_per_block(num_units, 1, capacity, Form::kMaxUnitsPerBlock);
  const int product_blocks = (num_units + units_per_block - 1) / units_per_block;
  launch_kernel(Kernel, job_blocks + product_blocks, few_row::kThreads, shared_bytes, stream, job, product,
                units_per_block);
  DS_CUDA_CHECK_LAUNCH();
}

void check_product_beside(const GroupedGemmArgs& product) {
  DS_CHECK_MSG(product.groups == nullptr && product.k_splits == 1 && product.ldx % 8 == 0 &&
                   product.dense.n_padded % kGemmTileRows == 0 && product.dense_rows >= 1 &&
                   product.dense_rows <= kFewRowGemmMaxRows,
               "a product beside the routing must be dense, of 1 to " << kFewRowGemmMaxRows << " rows");
}

}  // namespace

void launch_router_logits_beside(const float* x, const float* gate, int64_t num_tokens, int hidden, int num_experts,
                                 float* logits, const GroupedGemmArgs& product, Stream stream) {
  DS_CHECK(num_tokens >= 1 && num_tokens <= kMoeRoutePlanMaxTokens);
  check_product_beside(product);
  // x is the fp32 form of the product's rows: a norm left to the product is left to the logits too.
  const moe::RouterLogitsJob job{x, gate, hidden, num_experts, logits, num_tokens, product.rms_scale};
  const int job_blocks = static_cast<int>(num_tokens) * job.expert_blocks();
  few_row::with_block_form(product, product.dense_rows, [&](auto form) {
    using Form = decltype(form);
    launch_one<router_logits_beside_kernel<Form>, Form>(job, job_blocks, product, stream);
  });
}

void launch_router_logits_row_beside(const RouterLogitsRow& r, const GroupedGemmArgs& product, Stream stream) {
  DS_CHECK(product.dense_rows == 1);
  check_product_beside(product);
  const moe::RouterLogitsJob job = moe::one_token_job(r);
  few_row::with_block_form(product, 1, [&](auto form) {
    using Form = decltype(form);
    launch_one<router_logits_beside_kernel<Form>, Form>(job, job.expert_blocks(), product, stream);
  });
}

void launch_moe_route_and_plan_beside(const float* logits, int64_t num_tokens, const MoeRouteParams& p,
                                      const float* bias, int32_t* expert_ids, float* weights, int rows_per_block,
                                      int32_t* row_offsets, int32_t* block_offsets, int32_t* src_rows,
                                      int32_t* slot_rows, const GroupedGemmArgs& product, Stream stream,
                                      const RowRmsScale& logits_rms, bool one_warp_for_one_token,
                                      RouteRehearsal rehearsal) {
  moe::check_route_params(p);
  DS_CHECK(num_tokens >= 1 && num_tokens <= kMoeRoutePlanMaxTokens);
  check_product_beside(product);
  const moe::RoutePlanJob job{logits,        static_cast<int>(num_tokens), p,        bias,
                              expert_ids,    weights,                      rows_per_block, row_offsets,
                              block_offsets, src_rows,                     slot_rows, logits_rms,
                              one_warp_for_one_token, rehearsal};
  if (job.one_warp_for_one_token && moe::one_warp_routes(job.num_tokens, p)) {
    DS_CHECK(product.dense_rows == 1);  // the step's one token
    few_row::with_block_form(product, 1, [&](auto form) {
      using Form = decltype(form);
      launch_one<route_plan_one_warp_beside_kernel<Form>, Form>(job, 1, product, stream);
    });
    return;
  }
  // e4m3 products of up to two phases: the plan's shared memory leaves no room for x pieces of
  // four (the shared down product's K is two phases or less in V2 and V3).
  constexpr int kMaxFixedPhases = 4, kMaxFp8FixedPhases = 2;
  few_row::with_block_form<kMaxFixedPhases, kMaxFp8FixedPhases>(product, product.dense_rows, [&](auto form) {
    using Form = decltype(form);
    launch_one<route_plan_beside_kernel<Form>, Form>(job, 1, product, stream);
  });
}

}  // namespace dsinfer::cuda
