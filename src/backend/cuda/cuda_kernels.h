// Host launchers of the CUDA backend's kernels. Plain header: the stream is forward-declared so
// that C++ files can call the launchers without including CUDA headers. Every pointer is a
// device pointer unless its name says otherwise; all launches are asynchronous on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/token_choice.h"

struct CUstream_st;

namespace dsinfer::cuda {

using Stream = CUstream_st*;

// ---- element-wise and row kernels (cuda_elementwise.cu) ----
// Rows in DeepSeek's FP8 activations, as launch_quantize_rows_e4m3 writes them: q e4m3
// [rows_padded, k], scales fp32 [k / 128, rows_padded]. q null: none asked for.
struct E4m3Rows {
  uint8_t* q = nullptr;
  float* scales = nullptr;
  int64_t rows_padded = 0;
};
// out = rms_norm(x) · w, rows of n. With out_bf16, the same values also go there in bf16
// [rows, ld_bf16] (rounded as launch_f32_to_bf16_padded rounds, columns n..ld_bf16 zero), for a
// product that takes the norm's output next; with e4m3.q (out_bf16 too, ld_bf16 == n, n a
// multiple of 128), those bf16 rows also in e4m3, the same bits as launch_quantize_rows_e4m3
// would make of them, written by the norm itself where its row fits the register form.
void launch_rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* out,
                     uint16_t* out_bf16, int64_t ld_bf16, const E4m3Rows& e4m3, Stream stream);
void launch_add(float* x, const float* y, int64_t n, Stream stream);
// x += y, then out = rms_norm(x) · w, rows of n, in one pass over the rows: the same fp32
// operations and reduction order as launch_add followed by launch_rms_norm; out_bf16 and e4m3
// as there.
void launch_add_rms_norm(float* x, const float* y, const float* w, float eps, int64_t rows, int64_t n, float* out,
                         uint16_t* out_bf16, int64_t ld_bf16, const E4m3Rows& e4m3, Stream stream);
// A norm left to the products that read its output (steps of a few rows; CudaBackend's
// PendingNorm has the why): the kernel before them adds its outputs to the residual rows x,
// writes x · w (the norm's output before each row's 1 / rms(x)) and each 4 columns' squares of
// x (squares_of_four, row_rms.cuh); every product that reads those rows multiplies its sums by
// the row's factor, which it finishes from those partial sums. So the norm costs no launch of its
// own between the product before it and the ones after.
struct ResidualNormOutput {
  float* x = nullptr;            // [rows, n] residual, += the kernel's outputs; null: none
  const float* w = nullptr;      // [n] the norm's weight
  float* out = nullptr;          // [rows, n] x · w
  uint16_t* out_bf16 = nullptr;  // [rows, n] the same in bf16 (n a multiple of 128: no padding)
  float* partials = nullptr;     // [rows, n / 4] columns 4j .. 4j + 3's squares of the new x
};
// The rows a kernel reads hold x · w of residual rows x of n columns (n a multiple of 16): its
// sums get each row's 1 / sqrt(mean(x²) + eps), from the partials the kernel before wrote
// (ResidualNormOutput). partials null: the rows are whole.
struct RowRmsScale {
  const float* partials = nullptr;  // [rows, n / 4]
  int n = 0;
  float eps = 0.0f;
};
// Applies s to rows [rows, n] of out (fp32) and out_bf16 (its copy), in place: the norm's output
// as the products above see it, for a reader that applies no factor.
void launch_apply_row_rms(const RowRmsScale& s, int64_t rows, float* out, uint16_t* out_bf16, Stream stream);
// The most slots whose rows a combine thread requests together. A decode step's combine is a
// chain of memory trips between the layer's products: reading each slot's row number, then its
// row, after the sum of the slot before made two trips a slot (12 for V2-Lite's six), where one
// round of up to eight slots makes two.
constexpr int kMoeCombineSlotsAtOnce = 8;
// A MoE layer's routed rows and what its combine reads besides: expert_out [T * top_k,
// ld_expert] fp32, or bf16 where expert_out_bf16; slot_row (each entry's row of expert_out) and
// weights [T * top_k]; shared fp32 [T, hidden] or null.
struct MoeCombineRows {
  const void* expert_out = nullptr;
  bool expert_out_bf16 = false;
  int64_t ld_expert = 0;
  const int32_t* slot_row = nullptr;
  const float* weights = nullptr;
  const float* shared = nullptr;
  int top_k = 0;
  // Slots requested together by the combine kernel, 1 to kMoeCombineSlotsAtOnce (the same
  // bits at any count; 1 is the one-slot-at-a-time chain, for comparison).
  int slots_at_once = kMoeCombineSlotsAtOnce;
};
// Whether the routed and shared rows can be read four columns at a time (16-byte fp32 or 8-byte
// bf16 pieces) for rows of `hidden`.
bool moe_combine_rows_in_fours(const MoeCombineRows& moe, int64_t hidden);
// out fp32 [T, hidden]: out[t] = sum_k weights[t, k] * expert_out[slot_row[t * top_k + k]] in
// slot order, + shared[t] where shared is not null.
void launch_moe_combine(const MoeCombineRows& moe, int64_t num_tokens, int64_t hidden, float* out, Stream stream);
// The same sums added to the residual rows r.x instead, which then give r.out, r.out_bf16 and
// r.partials (ResidualNormOutput; hidden a multiple of 128, moe_combine_rows_in_fours).
void launch_moe_combine_residual(const MoeCombineRows& moe, int64_t num_tokens, int64_t hidden,
                                 const ResidualNormOutput& r, Stream stream);
// Routed entries per token up to which the norm below makes the combined rows itself.
constexpr int kMoeCombineInNormMaxTopK = 8;
// launch_moe_combine into `combined`, then launch_add_rms_norm(x, combined, ...), with the same
// bits; where the norm's row fits its register form and top_k <= kMoeCombineInNormMaxTopK, in
// one pass that makes each combined row where it adds it, without writing `combined` (a step
// of few tokens then has one kernel fewer in its chain, and a prefill writes and reads back
// one fp32 row fewer per token).
void launch_moe_combine_add_rms_norm(float* x, const MoeCombineRows& moe, float* combined, const float* w, float eps,
                                     int64_t rows, int64_t n, float* out, uint16_t* out_bf16, int64_t ld_bf16,
                                     const E4m3Rows& e4m3, Stream stream);
void launch_silu_mul(const float* gate_up, int64_t rows, int64_t inter, float* out, Stream stream);
void launch_concat_cols(const float* a, const float* b, int64_t rows, int64_t na, int64_t nb, float* out,
                        Stream stream);
// y [rows, 2 · half] = [x | x] for x [rows, cols] of 2- or 4-byte elements (their bits), cols at
// most half, zeros after each copy's cols: the rows a product over a weight in two bf16 terms
// reads (weight_terms).
void launch_rows_twice(const void* x, size_t element_bytes, int64_t rows, int64_t cols, int64_t half, void* y,
                       Stream stream);
// x fp32 [rows, k] → y bf16 [rows, ldy], columns k..ldy zero. ldy a multiple of 8, y 16-byte
// aligned.
void launch_f32_to_bf16_padded(const float* x, int64_t rows, int64_t k, int64_t ldy, uint16_t* y, Stream stream);
// gate_up [rows, 2 * inter_padded] (fp32, or bf16 where gate_up_bf16) from a weight whose rows
// interleave 16 gate and 16 up rows (or, with halves, hold every gate row, then every up row:
// launch_gate_up_halves's copy) → out bf16 [rows, inter_padded] = silu(gate) · up.
// inter_padded a multiple of 16; gate_up 32-byte (fp32) or 16-byte (bf16) aligned, out 16.
void launch_silu_mul_interleaved(const void* gate_up, bool gate_up_bf16, int64_t rows, int64_t inter_padded,
                                 bool halves, uint16_t* out, Stream stream);
// The same SiLU·up written as the down product's FP8 rows (inter_padded a multiple of 128):
// q e4m3 [rows_padded, inter_padded] and scales [inter_padded / 128][rows_padded], the bits
// launch_quantize_rows_e4m3 makes of launch_silu_mul_interleaved's rows; q 8-byte aligned.
void launch_silu_mul_interleaved_e4m3(const void* gate_up, bool gate_up_bf16, int64_t rows, int64_t inter_padded,
                                      bool halves, int64_t rows_padded, uint8_t* q, float* scales, Stream stream);
// DeepSeek's activation quantisation (fp8_quantize.cu): x bf16 [rows, k] (k a multiple of 128)
// → q e4m3 [rows_padded, k] and scales fp32 [k / 128][rows_padded] (rows contiguous, the layout
// of LtMatmul::fp8), one scale per 128-column tile: its largest magnitude / 448. Rows from
// `rows` to rows_padded are zeros with scale 1.
void launch_quantize_rows_e4m3(const uint16_t* x, int64_t rows, int64_t k, int64_t rows_padded, uint8_t* q,
                               float* scales, Stream stream);
// The same in `terms` e4m3 terms (fp8_split.cu): term 0 the rows above, each next term those of
// what the terms before leave; q [terms * rows_padded, k] and scales [k / 128][terms *
// rows_padded], term t's rows from t * rows_padded.
constexpr int kMaxFp8ActivationTerms = 3;
void launch_quantize_rows_e4m3_terms(const uint16_t* x, int64_t rows, int64_t k, int64_t rows_padded, int terms,
                                     uint8_t* q, float* scales, Stream stream);
// out [rows, n] (fp32, or bf16 with out_bf16) = the sum over t of y's rows t * rows onward.
void launch_add_row_terms(const float* y, int terms, int64_t rows, int64_t n, void* out, bool out_bf16,
                          Stream stream);
// The same from fp32 rows (16-byte aligned), each value rounded to bf16 first: the bits of
// launch_f32_to_bf16_padded's rows through launch_quantize_rows_e4m3, in one pass.
void launch_quantize_rows_f32_e4m3(const float* x, int64_t rows, int64_t k, int64_t rows_padded, uint8_t* q,
                                   float* scales, Stream stream);
// ids[i] = chosen[-1 - ids[i]] where ids[i] < 0 (token placeholders of a step scheduled ahead).
void launch_resolve_placeholders(int32_t* ids, int64_t n, const int32_t* chosen, Stream stream);
// out[r] = index of the largest x[r, :] (the first on ties; NaN never wins), x fp32 [rows, n]
// (argmax_rows.cu). scratch: argmax_scratch_bytes() of device memory, zeroed before its first
// launch and left zeroed by each; it lets a step of few rows cut each row over several blocks.
// Launches that share a scratch must be ordered (one stream).
int64_t argmax_scratch_bytes();
void launch_argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out, void* scratch, Stream stream);
// out[i] = x[rows[i]] (rows of `width` floats).
void launch_gather_rows(const float* x, const int32_t* rows, int64_t num_rows, int64_t width, float* out,
                        Stream stream);

// ---- token choice (cuda_sampling.cu) ----
// logits fp32 [rows, vocab]: each penalties[i] (device, [num_penalties], each (row, token) once)
// changes its logit by penalised_logit, in place.
void launch_penalise_logits(float* logits, int64_t rows, int64_t vocab, const LogitPenalty* penalties,
                            int64_t num_penalties, Stream stream);

// out[r] = choose_token(logits row r, params[r]) for logits fp32 [rows, vocab] and params on the
// device; the workspace holds sample_rows_workspace_bytes(rows, vocab) bytes.
size_t sample_rows_workspace_bytes(int64_t rows, int64_t vocab);
void launch_sample_rows(const float* logits, int64_t rows, int64_t vocab, const RowSampling* params, void* workspace,
                        size_t workspace_bytes, int32_t* out, Stream stream);

// ---- MLA attention (cuda_attention.cu) ----
struct MlaDims {
  int num_heads;
  int kv_lora_rank;
  int qk_nope_head_dim;
  int qk_rope_head_dim;
  int v_head_dim;
  int block_size;
  // The cache's entries (latent_cache_format.h): fp32 [lora + rope], or FP8 with its scales and
  // bf16 rope part at these byte offsets. Query tiles and head tiles read fp32 caches only.
  bool cache_fp8 = false;
  int cache_entry_bytes = 0;
  int cache_scales_offset = 0;
  int cache_rope_offset = 0;
};

// Device-side token layout of one forward step (all int32, device pointers).
struct MlaBatchView {
  int num_tokens;
  const int32_t* positions;      // [T]
  const int32_t* token_seq;      // [T]
  const int32_t* slot_mapping;   // [T]
  const int32_t* table_offsets;  // [num_seqs] start of each sequence's block table in `tables`
  const int32_t* tables;         // concatenated block tables
};

// The new tokens' cache entries: kv_a [T, lora + rope] (c_kv | k_rope), the latent norm's
// weight and epsilon, and the layer's paged cache.
struct MlaCacheWrite {
  const float* kv_a = nullptr;
  const float* norm_w = nullptr;
  float eps = 0.0f;
  void* cache = nullptr;
};

// Writes the new tokens into the paged cache: RMS-normalised c_kv, RoPE-rotated k_rope (an FP8
// cache quantises each 128-column tile of c_kv with its own scale).
void launch_mla_cache_write(const MlaDims& d, const MlaBatchView& b, const MlaCacheWrite& job,
                            const float* rope_cos, const float* rope_sin, Stream stream);

// The most splits of a token's context launch_mla_attention takes (its merge weighs them in two
// passes of a warp's 32 lanes), and the most runs of the few-token tiles, which a form of the
// combine kernel with more registers merges.
constexpr int kMaxMlaSplits = 64;
constexpr int kMaxMlaLongSplits = 256;

// Absorbed attention over the paged cache, split along the context: q_lat = q_nope · W_UK per
// head, then each (token, head, split) block attends to its slice of positions 0..pos and leaves
// an unnormalised partial result (running max, sum, latent accumulator) in the workspace; the
// splits are merged into o_lat, which is projected through W_UV. num_splits == 1 is the plain
// kernel. split_len_tokens 0 sizes each token's splits from its own context length (the launch
// then depends on the batch's shape only, not on its contents, as a recorded graph needs); a
// fixed length keeps the summation order of a token independent of the rest of the batch.
// w_uv_t is W_UV transposed per head: [heads, kv_lora_rank, v_head_dim].
// Workspace: num_tokens * num_heads * num_splits * (kv_lora_rank + 2) floats; q_latent and
// o_latent: num_tokens * num_heads * kv_lora_rank floats each.
// prefill_tiles (device, [num_prefill_tiles, 2] = first token, count; tokens of one sequence
// with consecutive positions, at most 16) switches the middle two steps to the tensor-core
// prefill kernel of mla_tensor_core.cu, which covers every token of the batch through its tiles
// (num_splits > 1: cut into that many runs a tile, merged by the split path's combine);
// otherwise head_tile_blocks > 0 switches the middle two steps to the balanced head tiles of
// mla_decode_tiles.cu (workspace and work_starts sized as launch_mla_decode_head_tiles says).
// fast_forms lets the W_UK and W_UV products take forms whose summation order depends on the
// step's token count (never for batch-invariant steps): steps of at most four tokens a form
// built for weight bandwidth, steps of 16 tokens or more TF32 tensor cores (head_gemm_tf32.cu).
// out_bf16 (row stride ld_out_bf16; may be null): where steps that take those forms also get
// out rounded to bf16, for the product that follows; returns whether it was written.
// cache_write (may be null: the entries are written already): the step's new entries, written
// before the attention reads them; in steps of up to four tokens, inside the W_UK product's
// launch. fixed_split_forms: the split kernel takes its forms for DeepSeek's widths where they
// apply (the same bits as its generic form); split_group_positions (1 or 4): how many of its
// positions a warp scores at once. few_token_tiles: the splits' partial results come from
// launch_mla_decode_head_tiles_few_tokens (num_splits runs a token; few_token_tiles_early as its
// early_first_chunk) instead of the split kernel, and the split path's combine merges them.
// merge_beside_max_tokens: in split-path steps of up to that many tokens (at most four), that
// merge runs in the W_UV product's launch, where its blocks read their x (the same bits).
// weights_evict_first: the few-token form reads W_UK and W_UV under an L2 evict-first policy
// (weight_load.cuh), evict-normal otherwise.
bool launch_mla_attention(const MlaDims& d, const MlaBatchView& b, const float* q, const float* w_uk,
                          const float* w_uv_t, const float* rope_cos, const float* rope_sin, const void* cache,
                          float softmax_scale, int num_splits, int split_len_tokens, float* workspace,
                          float* q_latent, float* o_latent, float* out, const int32_t* prefill_tiles,
                          int num_prefill_tiles, int head_tile_blocks, int32_t* work_starts, bool fast_forms,
                          Stream stream, uint16_t* out_bf16 = nullptr, int64_t ld_out_bf16 = 0,
                          const MlaCacheWrite* cache_write = nullptr, bool fixed_split_forms = true,
                          int split_group_positions = 1, bool few_token_tiles = false,
                          bool few_token_tiles_early = true, int merge_beside_max_tokens = 0,
                          bool weights_evict_first = false);

// ---- the per-head products of absorbed MLA on tensor cores (head_gemm_tf32.cu) ----
// y[t, h, n] = Σ_k x[t, h, k] · w[h, k, n] for num_tokens tokens and every head, fp32 in memory,
// TF32 products with fp32 sums; also y rounded to bf16 into y_bf16 (row stride ld_y_bf16, head
// stride y_head_stride) where given, returning whether it wrote that copy. Shapes: k a multiple
// of 32, n of 128, rows 16-byte aligned (head_gemm_tf32_supported).
bool head_gemm_tf32_supported(const float* x, int64_t x_token_stride, int64_t x_head_stride, const float* w, int k,
                              int n, const float* y, int64_t y_token_stride, int64_t y_head_stride);
bool launch_head_gemm_tf32(const float* x, int64_t x_token_stride, int64_t x_head_stride, const float* w,
                           int num_heads, int k, int n, float* y, int64_t y_token_stride, int64_t y_head_stride,
                           int num_tokens, uint16_t* y_bf16, int64_t ld_y_bf16, Stream stream);

// ---- absorbed MLA attention on tensor cores (mla_tensor_core.cu) ----
// Rows of a tensor-core tile: 16 query tokens of one head (prefill), or 16 heads of one token
// (decode).
constexpr int kMlaTileRows = 16;
// Head widths the tensor-core tiles take (lora and lora + rope whole 16-column steps, within
// 512 and 576), whatever the cache format.
bool mla_tile_shapes_supported(const MlaDims& d);
// The prefill query tiles: those widths over an fp32 cache.
bool mla_tiles_supported(const MlaDims& d);
// o_latent [T, H, lora] for the tokens of the tiles (bf16 operands, fp32 softmax and sums).
// num_splits > 1: each tile's context is cut into that many equal runs (whole 32-position
// chunks), one block each, which leave their partial results in workspace [T, H, num_splits,
// lora + 2] for the split path's combine instead of writing o_latent.
void launch_mla_prefill_attention(const MlaDims& d, const MlaBatchView& b, const float* q, const float* q_latent,
                                  const float* rope_cos, const float* rope_sin, const float* cache,
                                  float softmax_scale, const int32_t* tiles, int num_tiles, int num_splits,
                                  float* workspace, float* o_latent, Stream stream);
// Decode in head tiles (up to 16 heads of a token per block; TF32 products of the fp32 cache,
// fp32 softmax and sums; mla_decode_tiles.cu), the work balanced over num_blocks blocks per head
// group whatever the tokens' context lengths, merged into o_lat [T, H, lora].
// Head tiles take the tile widths over an fp32 or FP8 cache, and need a cache block size that
// is a multiple of 16.
bool mla_head_tiles_supported(const MlaDims& d);
// Blocks per head group that fill the GPU once (a function of the model's shape only).
int mla_head_tile_blocks(const MlaDims& d, int num_sms);
// Workspace: (num_blocks + T) * num_heads * (kv_lora_rank + 2) floats; work_starts: T + 1 ints.
void launch_mla_decode_head_tiles(const MlaDims& d, const MlaBatchView& b, const float* q, const float* q_latent,
                                  const float* rope_cos, const float* rope_sin, const void* cache,
                                  float softmax_scale, int num_blocks, int32_t* work_starts, float* workspace,
                                  float* o_latent, Stream stream);
// A step of few tokens in head tiles: num_blocks runs of each token's context per head group (at
// most 64), their partial results in the split kernel's layout, workspace [T, H, num_blocks,
// lora + 2], for that kernel's combine (launch_mla_attention's split path). early_first_chunk:
// each block requests its first chunk of older entries before its wait.
void launch_mla_decode_head_tiles_few_tokens(const MlaDims& d, const MlaBatchView& b, const float* q,
                                             const float* q_latent, const float* rope_cos, const float* rope_sin,
                                             const void* cache, float softmax_scale, int num_blocks,
                                             float* workspace, bool early_first_chunk, Stream stream);

// ---- MLA prefill in the expanded form (mla_expanded.cu) ----
// latent bf16 [num_positions, ld_latent] = the cache entries of positions 0..num_positions-1 of
// one sequence (its block table `table`), columns entry..ld_latent zero.
void launch_mla_gather_latent(const MlaDims& d, const void* cache, const int32_t* table, int num_positions,
                              int ld_latent, uint16_t* latent, Stream stream);
// q_out bf16 [T, heads, qk_padded] = q fp32 [T, heads, nope + rope] with the rope part rotated
// at each token's position, columns nope + rope..qk_padded zero.
void launch_mla_expanded_queries(const MlaDims& d, const float* q, const int32_t* positions, int num_tokens,
                                 const float* rope_cos, const float* rope_sin, int qk_padded, uint16_t* q_out,
                                 Stream stream);
// q bf16 [T, heads, nope + rope] with each head's rope part rotated in place at each token's
// position (the rotation of launch_mla_expanded_queries, from bf16 values); for the head widths
// mla_rope_bf16_queries_supported takes, q and the tables 16-byte aligned.
bool mla_rope_bf16_queries_supported(int qk_nope, int qk_rope);
void launch_mla_rope_bf16_queries(const MlaDims& d, uint16_t* q, const int32_t* positions, int num_tokens,
                                  const float* rope_cos, const float* rope_sin, Stream stream);
// probs bf16 = softmax(scale · scores) per row of scores fp32 [heads, rows, ld] (num_keys used
// columns), causal: the query of row i sits at position first_query_pos + i and sees keys
// 0..that position; the keys after it get probability 0.
void launch_causal_softmax(const float* scores, int64_t ld, int num_heads, int rows, int num_keys, int first_query_pos,
                           float softmax_scale, uint16_t* probs, Stream stream);
// The same for bf16 rows; width a multiple of 8 (16-byte copies).
void launch_gather_rows_bf16(const uint16_t* x, const int32_t* rows, int64_t num_rows, int64_t width, uint16_t* out,
                             Stream stream);
// Fused causal attention of one chunk in the expanded form, one head per grid column:
// out[i, h, :v_dim] (rows ld_out floats apart) = softmax(scale · q_i·k_j, j <= first_pos + i,
// j < num_keys) · v_j, for queries bf16 [num_queries, heads, qk_padded]. Scores and
// probabilities stay in registers (bf16 products, fp32 softmax and sums). Keys and values:
// - with shared_rope (flash_attention_wgmma_supported head widths, on Hopper's warpgroup
//   products, mla_flash_wgmma.cu): bf16 [num_keys, heads, nope + v_padded] (k_nope then v per
//   head), and the keys' rope part, which MLA shares between heads, bf16 [num_keys, rope] with
//   rows ld_rope elements apart;
// - without: bf16 [num_keys, heads, qk_padded + v_padded] (k then v per head), on mma.sync, for
//   the head widths that flash_attention_supported accepts (mla_flash.cu).
// Every tensor starts at a 16-byte boundary (the kernels copy 16-byte pieces, or TMA boxes).
bool flash_attention_supported(int qk_padded, int v_padded);
bool flash_attention_wgmma_supported(int qk_nope, int qk_rope, int v_padded);
void launch_expanded_flash_attention(const uint16_t* queries, const uint16_t* kv, const uint16_t* shared_rope,
                                     int64_t ld_rope, int num_heads, int qk_padded, int v_padded, int v_dim,
                                     int num_queries, int first_pos, int num_keys, float softmax_scale, float* out,
                                     int64_t ld_out, Stream stream);
// out[rows[i]] = x[i] (rows of `width` floats).
void launch_scatter_rows(const float* x, const int32_t* rows, int64_t num_rows, int64_t width, float* out,
                         Stream stream);

// ---- MoE (cuda_moe.cu) ----
struct MoeRouteParams {
  int num_experts;
  int top_k;
  int num_groups;
  int topk_groups;
  bool sigmoid;         // else softmax
  int topk_method;      // 0 greedy, 1 group_limited_greedy, 2 noaux_tc
  bool norm_topk_prob;
  float routed_scaling_factor;
};
// Router logits in fp32: logits [T, E] = x [T, hidden] · gate [E, hidden]ᵀ, batch-invariant.
void launch_router_logits(const float* x, const float* gate, int64_t num_tokens, int hidden, int num_experts,
                          float* logits, Stream stream);
// Routes each of the T tokens (scores, optional correction bias (may be null), group limit,
// top-k: expert_ids and weights [T * top_k]), then groups the T * top_k routed entries by
// expert: row_offsets / block_offsets [E + 1] (block = rows_per_block rows), src_rows [T * top_k]
// (source token of each grouped row), slot_rows [T * top_k] (grouped row of each entry). A step
// of up to kMoeRoutePlanMaxTokens tokens does both in one launch. Many entries (prefill) are
// planned over several blocks, which need a workspace of moe_plan_workspace_ints int32 (none for
// a decode step's few). A step of one token of up to 64 experts without a group limit routes
// and plans in one warp (one_warp_for_one_token; false: the block's path, with the same bits).
constexpr int kMoeRoutePlanMaxTokens = 4;
int64_t moe_plan_workspace_ints(int num_entries, int num_experts);
void launch_moe_route_and_plan(const float* logits, int64_t num_tokens, const MoeRouteParams& p, const float* bias,
                               int32_t* expert_ids, float* weights, int rows_per_block, int32_t* row_offsets,
                               int32_t* block_offsets, int32_t* src_rows, int32_t* slot_rows, int32_t* workspace,
                               Stream stream, bool one_warp_for_one_token = true);
// Prefill-sized MoE layers without the host: the entries grouped by expert
// (launch_moe_route_and_plan with rows_per_block = chunk_rows, so that its block offsets count
// chunks) are cut into chunks of chunk_rows rows, each one entry of a batched product through
// pointer arrays. Chunk c of
// expert e reads chunk_rows grouped rows of x from its first one (rows past the expert's end
// belong to the next expert or to x's spare rows, and their results are never read) and
// writes chunk_rows rows at c * chunk_rows of the gate/up, activation and output buffers.
// Chunks past the last expert's (the host sizes the batch from the entry count alone) take
// expert 0's weights and rows and their own output rows. chunk_slot_rows [num_entries] gets
// the output row of every (token, slot) entry, for the combine.
struct GemmWeight;
struct MoeChunkLayout {
  const int32_t* row_offsets = nullptr;    // [E + 1] first grouped row of each expert
  const int32_t* chunk_offsets = nullptr;  // [E + 1] first chunk of each expert
  const GemmWeight* gate_up = nullptr;     // [E] the experts' weights
  const GemmWeight* down = nullptr;        // [E]
  // Where set, the products read bf16 copies of the weights instead, expert e's at
  // e * *_widened_stride elements (e4m3 experts, widened for the layer).
  const uint16_t* gate_up_widened = nullptr;
  const uint16_t* down_widened = nullptr;
  int64_t gate_up_widened_stride = 0, down_widened_stride = 0;
  int num_experts = 0, num_chunks = 0, chunk_rows = 0;
  const uint16_t* x = nullptr;  // bf16 grouped rows [entries + chunk_rows, ld_x]
  int64_t ld_x = 0;
  uint16_t* gate_up_out = nullptr;  // bf16 [num_chunks * chunk_rows, ld_gate_up]
  int64_t ld_gate_up = 0;
  uint16_t* act = nullptr;  // bf16 [num_chunks * chunk_rows, ld_act]
  int64_t ld_act = 0;
  uint16_t* out = nullptr;  // bf16 [num_chunks * chunk_rows, ld_out]
  int64_t ld_out = 0;
  // [6][num_chunks]: gate/up x, w, y, then down x, w, y
  void** pointers = nullptr;
  const int32_t* expert_ids = nullptr;  // [num_entries]
  const int32_t* slot_rows = nullptr;   // [num_entries] grouped row of each entry
  int num_entries = 0;
  int32_t* chunk_slot_rows = nullptr;  // [num_entries]
};
void launch_moe_chunk_layout(const MoeChunkLayout& layout, Stream stream);

}  // namespace dsinfer::cuda
