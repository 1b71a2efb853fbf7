// The CUDA backend's own GEMM: y = x · Wᵀ over groups of rows, each group with its own weight
// (the routed experts of an MoE layer), or one group (a dense linear). Plain header: usable from
// C++ files without CUDA headers.
//
// Why our own: decode multiplies a few rows per expert by weights that are read once, so the
// product is bound by weight bandwidth; cuBLASLt has no grouped matmul and its per-call plans
// need the group sizes on the host. This kernel reads the group layout from device memory (the
// routing kernel writes it), so a whole MoE layer runs without the host, and a step can be
// recorded as a CUDA graph.
//
// Shape of the work, dense form: a thread block owns 32 weight rows (outputs) and up to 64 rows
// of x; its four warps split K four ways (warp w takes the 32-wide K chunks w, w + 4, …), stream their
// chunks through a cp.async pipeline into tensor-core products (bf16 in, fp32 accumulate, the
// weight as the 32-row operand, 8 rows of x per fragment), and sum their partial tiles in a
// fixed order. The grouped form runs on the same blocks, or, with `expert_blocks`, on blocks of
// 128 weight rows of one expert (grouped_gemm_experts.cu, grouped_gemm_experts_fp8.cu): a warp
// per 32 rows, the four sharing one block-wide pipeline of x and weight chunks, each warp
// summing its outputs over the whole K in order. Either way the summation order of an output element
// never depends on how many rows the batch has, which keeps greedy decoding batch-invariant
// as long as the caller's choice of blocks does not depend on it either.
//
// FP8 weights (e4m3) are widened to bf16 exactly in registers as they are used
// (grouped_gemm.cuh, mma_e4m3_step), and their block scales multiply the sums: a decode step
// reads one byte per weight.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {

// Rows per weight-row tile, the granularity of padding and of e4m3 scales along n.
constexpr int kGemmTileRows = 32;
// K granularity of the kernel (one pipeline chunk).
constexpr int kGemmChunkK = 32;
// Rows of x one thread block handles (the grouped layout counts tiles of this many rows).
constexpr int kGemmRowsPerBlock = 64;
// Routed rows per row-block of the prefill expert blocks (grouped_gemm_experts_prefill.cu).
constexpr int kExpertBlockWideRows = 128;
// Gate/up interleaving of fused weights: within each 32-row tile, 16 gate rows then the 16 up
// rows of the same outputs.
constexpr int kGemmGateUpHalf = 16;

// A weight packed for the kernel: [n_padded, k_padded] row-major, zero padded, bf16 or e4m3.
// e4m3 weights carry one fp32 scale per 16 rows × 128 columns: scales[(row / 16) * scale_cols
// + col / 128] with scale_cols = ceil(k_padded / 128).
struct GemmWeight {
  const void* data = nullptr;
  const float* scales = nullptr;  // null: bf16 weight
  int32_t n_padded = 0;           // multiple of kGemmTileRows
  int32_t k_padded = 0;           // multiple of kGemmChunkK
};

enum class GemmEpilogue : int32_t {
  kStoreF32 = 0,     // y fp32 [rows, ldy]: columns below n_out
  kSiluMulBf16 = 1,  // y bf16 [rows, ldy]: y[:, j] = silu(gate_j) · up_j from an interleaved weight
  kStoreBf16 = 2,    // y bf16 [rows, ldy]: columns below n_out (the prefill expert blocks only)
  // y e4m3 [rows, ldy] and y_scales: the kSiluMulBf16 rows as launch_quantize_rows_e4m3 makes
  // them (the prefill expert blocks' 256-row tiles only, n_out a multiple of 128).
  kSiluMulE4m3 = 3,
  // y fp32 [rows, ldy]: the kSiluMulBf16 outputs unrounded (the few-row kernel's CUDA-core forms
  // only), for a down product that reads fp32 rows (x_f32).
  kSiluMulF32 = 4,
};

struct GroupedGemmArgs {
  const uint16_t* x = nullptr;  // bf16 [*, ldx], zero beyond each row's k
  int64_t ldx = 0;              // multiple of 8, >= every weight's k_padded
  const int32_t* src_rows = nullptr;  // [num_rows] x row of each output row; null: the same row
  // Few-row kernel, passes of one row over bf16 weights: x's rows in fp32 instead (x unread),
  // x_f32 [*, ldx_f32] of which columns [0, x_f32_cols) are read and the rest taken as zeros
  // (x_f32 16-byte aligned, ldx_f32 a multiple of 4, x_f32_cols of 8). The products of a
  // single sequence's decode steps keep the bits that bf16 rows would round away.
  const float* x_f32 = nullptr;
  int64_t ldx_f32 = 0;
  int x_f32_cols = 0;
  // Grouped form: device arrays of num_groups weights, the first output row of each group
  // ([num_groups + 1]) and the first row-block of each group ([num_groups + 1], blocks of
  // rows_per_block rows). Dense form (groups == nullptr): `dense` over rows [0, dense_rows).
  const GemmWeight* groups = nullptr;
  const int32_t* row_offsets = nullptr;
  const int32_t* block_offsets = nullptr;
  int num_groups = 0;
  // kGemmRowsPerBlock, or kExpertBlockWideRows for e4m3 activations in the prefill expert
  // blocks (no other kernel takes row-blocks of more than 64 rows).
  int rows_per_block = kGemmRowsPerBlock;
  // Grouped form, few-row kernel: the layout was written by a kernel launched on this stream
  // before the previous one, so it is complete when this kernel starts and may be read before
  // the wait, and the first weight pieces requested with it (the routed experts' down product,
  // whose gate/up product is the launch in between).
  bool layout_before_wait = false;
  // Few-row kernels: the weights are read under an L2 evict-first policy (false: evict-normal).
  // A decode step reads each weight once, and a V2-Lite layer's 90–170 MB of them pass through
  // the 50 MB L2, where they would push out what the layer's next launches read again soon:
  // their instructions, the activations, the routing's tables.
  bool weights_evict_first = false;
  GemmWeight dense;
  int dense_rows = 0;
  bool weights_fp8 = false;  // every weight of the call is e4m3 (else bf16)
  // The few-row kernel takes e4m3 weights on f16 tensor-core products (few_row_mma.cuh) instead
  // of CUDA cores: another order of the sums, the same exact products.
  bool few_row_mma = false;
  // The few-row kernel's CUDA-core blocks of one or two rows walk K in a phase count fixed at
  // compile time where x's rows allow it (few_row::fixed_phases; the same sums).
  bool few_row_fixed_phases = true;
  // Grouped form: 128-row expert blocks, which keep about three times the bytes in flight and
  // read x a quarter as often; worth it from a few rows per expert up. Their sums run in another
  // order than the 32-row blocks'.
  bool expert_blocks = false;
  // e4m3 activations for e4m3 weights in the 128-row expert blocks of a grouped call: DeepSeek's
  // FP8 recipe (grouped_gemm_experts_wgmma.cu; every weight's k_padded a multiple of 128;
  // k_splits 1). x quantised per row and 128 columns by launch_quantize_rows_e4m3: xq [*, ldx]
  // e4m3 and x_scales [ldx / 128][x_scale_rows]. x is then not read.
  const uint8_t* xq = nullptr;
  const float* x_scales = nullptr;
  int64_t x_scale_rows = 0;
  // xq in x_terms e4m3 terms (launch_quantize_rows_e4m3_terms), which the decode-sized expert
  // blocks add (up to kMaxFp8ActivationTerms, in passes of 32 rows): term t's row r is row
  // t * x_term_rows + r of xq and of x_scales' columns.
  int x_terms = 1;
  int64_t x_term_rows = 0;
  int pass_rows = 0;  // routed rows per pass there: 32 or 64, or 0 to choose by the rows per expert
  int prefill_weight_rows = 256;  // weight rows per tile in the prefill expert blocks: 256, 192 or 128
  // kStoreBf16 from the prefill expert blocks' 256-row tiles through shared memory in 16-byte
  // pieces instead of a thread's own 4-byte pairs.
  bool staged_bf16_stores = false;
  // The prefill expert blocks' 256-row tiles copy their weight rows by TMA from weight_maps, a
  // CUtensorMap per group (e4m3 [n_padded, k_padded], boxes of 128 rows × 128 bytes in the
  // 128-byte swizzle; 64-byte aligned in device memory), instead of by cp.async.
  bool tma_weights = false;
  const void* weight_maps = nullptr;
  // With tma_weights and without src_rows (each row-block's rows contiguous in xq): the rows by
  // TMA too, one box of the row-block's 128 rows a stage, instead of every copying thread's
  // 16-byte cp.async pieces.
  bool tma_rows = false;
  GemmEpilogue epilogue = GemmEpilogue::kStoreF32;
  void* y = nullptr;
  int64_t ldy = 0;
  float* y_scales = nullptr;  // kSiluMulE4m3: [n_out / 128][y_scale_rows]
  int64_t y_scale_rows = 0;
  int n_out = 0;  // kStore*: columns written; kSiluMulBf16: outputs written (<= n_padded / 2)
  // Split K over k_splits thread blocks per tile (dense form only): each writes its partial
  // tile to `partials` [k_splits, dense_rows, n_padded] fp32, and the last to finish (counted in
  // tile_counters, zero before and after the call) adds them in split order and applies the
  // epilogue. The split count must depend on the weight's shape only, never on the rows, for
  // the result of a row to stay independent of the batch.
  int k_splits = 1;
  float* partials = nullptr;
  int* tile_counters = nullptr;
  // Few-row kernel only. x's rows (by src_rows where given) hold a norm's output before each
  // row's 1 / rms: the sums are multiplied by it (kStoreF32; both halves of kSiluMul*).
  RowRmsScale rms_scale;
  // Few-row kernel, dense kStoreF32 only: the outputs go to the residual rows (ldy apart) and the
  // next norm's output instead of y (y unused).
  ResidualNormOutput residual_norm;
};

// The split count the backend uses for a dense weight of this padded shape: enough thread
// blocks to keep the GPU's memory system busy when the product has a single row-block.
int gemm_k_splits(int n_padded, int k_padded);
// tile_counters must hold this many ints for a launch (zeroed once).
constexpr int kGemmMaxTileCounters = 1 << 16;

// An upper bound of the row-blocks of a grouped call of `rows` rows over num_groups groups in
// row-blocks of rows_per_block: one per rows_per_block rows plus a partial one per group, and no
// more than the rows, since no row-block is empty.
inline int64_t grouped_max_row_blocks(int64_t rows, int rows_per_block, int num_groups) {
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block + num_groups;
  return blocks < rows ? blocks : rows;
}

// max_n_padded: the largest n_padded of any group; max_row_blocks: an upper bound of the number
// of row-blocks (dense: ceil(dense_rows / 64); grouped: grouped_max_row_blocks);
// rows_hint: typical rows per group, which picks the fragment count (never the result).
void launch_grouped_gemm(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, int rows_hint,
                         Stream stream);

// The 128-row expert blocks (launch_grouped_gemm calls them for args.expert_blocks): bf16
// weights (grouped_gemm_experts.cu), e4m3 weights (grouped_gemm_experts_fp8.cu), e4m3 weights
// and activations (args.xq; grouped_gemm_experts_wgmma.cu).
void launch_expert_gemm(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, int rows_hint,
                        Stream stream);
void launch_expert_gemm_fp8(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, int rows_hint,
                            Stream stream);
void launch_expert_gemm_fp8_activations(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks,
                                        int rows_hint, Stream stream);
// The prefill expert blocks (grouped_gemm_experts_prefill.cu): e4m3 weights and activations over
// row-blocks of kExpertBlockWideRows rows (args.rows_per_block), a copying warpgroup and two
// math warpgroups a block.
void launch_expert_gemm_prefill(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, Stream stream);

// Products of at most a few rows per row-block (decode at batch 1 to 4) on CUDA cores
// (few_row_gemm.cu), or for e4m3 weights with few_row_mma on f16 tensor-core products
// (few_row_mma.cuh): a block takes weight rows four at a time (32 on tensor cores) over their
// whole K, so no partial sum leaves it, and the order of an output's sums depends on K alone
// (another order than the tensor-core kernels'). Takes the same arguments, with k_splits 1;
// max_rows_per_block bounds the rows of a row-block (dense: the rows; grouped: the rows of the
// largest group) and only picks how many are handled together.
constexpr int kFewRowGemmMaxRows = 4;
// The backend's default bound: at batch 4 on the V2-Lite shape the tensor-core kernel was faster
// (its routed experts, about one row each, read once per 32-row tile either way, but without the
// few-row kernel's sums of four rows per weight piece).
constexpr int kFewRowGemmDefaultMaxRows = 2;
void launch_few_row_gemm(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, int max_rows_per_block,
                         Stream stream);
// A grouped product (args of launch_few_row_gemm, taken in blocks of one row a pass) and a dense
// product of one row in one launch (few_row_gemm_with_dense.cu: the grouped blocks, then the
// dense ones), each output with the bits of its own launch: an MoE layer's routed experts'
// product and its shared experts' down product at batch 1. Where the two products' forms are not
// among those compiled together, in two launches.
void launch_few_row_gemm_with_dense(const GroupedGemmArgs& grouped, int max_n_padded, int max_row_blocks,
                                    const GroupedGemmArgs& dense, Stream stream);
// A grouped product of one row a row-block and its routed rows' MoE combine in one launch
// (few_row_gemm_combine.cu): a one-token step's routed down product (args of launch_few_row_gemm,
// fp32 output rows, which are rows.expert_out), whose blocks of each column slice, one a
// row-block, count their arrivals in arrivals[slice] (max_arrivals of them, zero before the
// launch and left zero); the last to arrive combines the slice's columns into `out` as
// launch_moe_combine_residual does, with the same bits.
void launch_few_row_gemm_combine(const GroupedGemmArgs& down, int max_n_padded, int max_row_blocks,
                                 const MoeCombineRows& rows, int64_t hidden, const ResidualNormOutput& out,
                                 int32_t* arrivals, int max_arrivals, Stream stream);
// One token's router logits, logits[e] = add[e] + x · gate[e] in fp32 (add null: none), as the
// router logits kernel makes them (moe_routing.cuh), made beside a product.
struct RouterLogitsRow {
  const float* x = nullptr;     // [hidden]
  const float* gate = nullptr;  // [num_experts, hidden]
  int hidden = 0, num_experts = 0;
  float* logits = nullptr;     // [num_experts]
  const float* add = nullptr;  // [num_experts]
};
// Two dense few-row products of the same rows in one launch (a's blocks, then b's; each output
// has the bits of its own launch): both dense, of `rows` rows, with the same weight type and
// form (few_row_mma alike). With logits, the launch's first blocks make them too.
void launch_few_row_gemm_pair(const GroupedGemmArgs& a, const GroupedGemmArgs& b, int rows, Stream stream,
                              const RouterLogitsRow* logits = nullptr);

// Who runs a one-token routing once on no data before the routing's wait, so that its code is
// fetched while the launch before drains (moe_routing_beside.cu): no one, the routing's warp
// itself, or a second warp of its block while the routing's warp waits.
enum class RouteRehearsal : uint8_t { kNone, kSameWarp, kBesideWarp };

// The router logits (launch_router_logits) and the routing and planning (launch_moe_route_and_plan)
// of a step of 1 to kMoeRoutePlanMaxTokens tokens, each with a dense few-row product (args of
// launch_few_row_gemm, groups null, 1 to kFewRowGemmMaxRows rows) in the blocks after its own, in
// one launch (moe_routing_beside.cu): an MoE layer's shared experts, gate/up beside the logits and
// down beside the routing. The product's output has the bits of launch_few_row_gemm's. Where the
// product's rows leave a norm's 1 / rms to it (rms_scale), the router logits' x is that norm's
// fp32 output and gets the same factor. Variants: the logits of one token's fp32 row that is not
// the product's (logits_row: x, gate and add as RouterLogitsRow, no factor), beside any dense
// product of one row; and logits of a norm's output before each row's 1 / rms, which the routing
// applies first (logits_rms). A one-token routing in one warp (one_warp_for_one_token) is also run
// once on no data before its wait, by that warp or by a second one, as `rehearsal` says
// (moe_routing_beside.cu has the why).
void launch_router_logits_beside(const float* x, const float* gate, int64_t num_tokens, int hidden, int num_experts,
                                 float* logits, const GroupedGemmArgs& product, Stream stream);
void launch_router_logits_row_beside(const RouterLogitsRow& logits_row, const GroupedGemmArgs& product,
                                     Stream stream);
void launch_moe_route_and_plan_beside(const float* logits, int64_t num_tokens, const MoeRouteParams& p,
                                      const float* bias, int32_t* expert_ids, float* weights, int rows_per_block,
                                      int32_t* row_offsets, int32_t* block_offsets, int32_t* src_rows,
                                      int32_t* slot_rows, const GroupedGemmArgs& product, Stream stream,
                                      const RowRmsScale& logits_rms = {}, bool one_warp_for_one_token = true,
                                      RouteRehearsal rehearsal = RouteRehearsal::kNone);

// Dequantises an e4m3 weight in the kernel's layout to bf16 [n_padded, k_padded].
void launch_gemm_weight_to_bf16(const GemmWeight& w, uint16_t* out, Stream stream);

}  // namespace dsinfer::cuda
