// The CUDA backend's MLA attention: host-side planning around the kernels of cuda_attention.cu,
// mla_tensor_core.cu, mla_decode_tiles.cu, mla_expanded.cu and mla_flash.cu.
//
// Two forms of the same attention:
// - absorbed (decode, chunks of fewer than 16 tokens): queries absorb W_UK and attend over the 576-wide latent
//   cache directly; per query-key pair that is 576 + 512 multiply-adds per head, but nothing is
//   up-projected, so it is the form for few queries over a long context;
// - expanded (prefill chunks of 16 tokens or more, expanded_min_tokens_): the chunk's context is
//   up-projected once into per-head keys and values, and attention runs as ordinary multi-head
//   attention: 192 + 128 multiply-adds per head and pair (V3), in one fused kernel with the
//   scores in registers (mla_flash.cu), or as cuBLASLt products with the scores in memory
//   (DSINFER_MLA_FLASH=0, or head widths the kernel does not take).
// A batch mixing both runs the expanded chunks first, then the rest of its tokens, compacted,
// through the absorbed kernels.
#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_state.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/lt_matmul.h"
#include "core/dtype.h"

namespace dsinfer::cuda {
namespace {

// Queries per score block: smaller blocks skip more of the causal upper triangle, larger ones
// make larger products.
constexpr int kExpandedMaxQueryRows = 512;
// Score block size (heads × queries × keys fp32, plus bf16 probabilities of the same shape).
constexpr int64_t kExpandedScoreElements = int64_t{1} << 27;
// Small decode batches split their contexts until there are this many fp32 blocks per SM: as
// many as fit on one at a time (the kernel's registers allow five), so that the splits run in
// one wave. Eight made a batch-1 step's 1,024 blocks one and a half waves, and took 1-2% longer
// at batches 1 to 8 (bench/RESULTS.md).
constexpr int kSplitBlocksPerSm = 4;
// Up-projected keys and values of one context above this size stay in the absorbed form.
constexpr int64_t kExpandedMaxKvBytes = int64_t{4} << 30;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Widths of the expanded form, padded to 16 columns (whole MMA steps for the fused kernel;
// every cuBLASLt operand starts on 16 bytes). The keys' rope part is the cache's own rotated
// k_rope, one for all heads. Per head the up-projection writes
// - with rope_shared (the fused kernel's warpgroup form, which reads the rope columns from the
//   latent rows): [k_nope | v | pad], from the latent's kv_lora_rank columns;
// - else [k_nope | k_rope | pad | v | pad], the rope copied through identity rows of the
//   projection, from all ld_latent columns.
struct ExpandedLayout {
  bool rope_shared;
  int64_t qk_padded, v_padded;
  int64_t key_cols;    // a head's key columns in the up-projected rows (where its v starts)
  int64_t head_width;  // a head's columns in the up-projected rows
  int64_t ld_latent;   // the gathered latent rows' width (bf16 [positions, lora + rope])
  int64_t up_k;        // the up-projection's depth, and its weight rows' width
  ExpandedLayout(const MlaWeights& w, bool rope_shared)
      : rope_shared(rope_shared),
        qk_padded(round_up(w.qk_nope_head_dim + w.qk_rope_head_dim, 16)),
        v_padded(round_up(w.v_head_dim, 16)),
        key_cols(rope_shared ? w.qk_nope_head_dim : qk_padded),
        head_width(key_cols + v_padded),
        ld_latent(round_up(w.kv_lora_rank + w.qk_rope_head_dim, 8)),
        up_k(rope_shared ? w.kv_lora_rank : ld_latent) {}
  // The fp32 output rows [T, heads * v] must start on 16 bytes per head.
  static bool supported(const MlaWeights& w) { return w.v_head_dim % 4 == 0; }
};

// MlaWeights::derived on this backend: W_UV transposed per head (fp32 [heads, lora, v], for the
// absorbed output projection), then the expanded up-projection (bf16 [heads * head_width,
// up_k]) at this byte offset.
size_t expanded_weight_offset_bytes(const MlaWeights& w) {
  return static_cast<size_t>(round_up(static_cast<int64_t>(w.num_heads) * w.kv_lora_rank * w.v_head_dim * 4, 256));
}

MlaDims mla_dims(const MlaWeights& w, int block_size, KvCacheFormat format) {
  MlaDims d{w.num_heads, w.kv_lora_rank, w.qk_nope_head_dim, w.qk_rope_head_dim, w.v_head_dim, block_size};
  d.cache_entry_bytes = static_cast<int>(latent_entry_bytes(format, w.kv_lora_rank, w.qk_rope_head_dim));
  if (format == KvCacheFormat::kFp8) {
    const Fp8LatentLayout layout{w.kv_lora_rank, w.qk_rope_head_dim};
    d.cache_fp8 = true;
    d.cache_scales_offset = layout.scales_offset();
    d.cache_rope_offset = layout.rope_offset();
  }
  return d;
}

// A sequence of the batch whose new tokens attend in the expanded form.
struct ExpandedChunk {
  int first_token;
  int num_tokens;
  int context_len;      // positions 0..context_len-1, the chunk being the last num_tokens
  int32_t table_offset;  // of the sequence's block table in the step's concatenated tables
};

// The sequences of the batch whose new tokens attend in the expanded form: runs of a sequence's
// consecutive positions of min_tokens tokens or more whose keys and values fit.
std::vector<ExpandedChunk> plan_expanded_chunks(const ForwardBatch& batch, const MlaWeights& w,
                                                const ExpandedLayout& layout, int min_tokens) {
  std::vector<ExpandedChunk> chunks;
  std::vector<int32_t> table_offsets(batch.block_tables.size());
  for (size_t s = 1; s < table_offsets.size(); ++s)
    table_offsets[s] = table_offsets[s - 1] + static_cast<int32_t>(batch.block_tables[s - 1].size());
  for (int t = 0; t < batch.num_tokens;) {
    int n = 1;
    while (t + n < batch.num_tokens && batch.token_seq[t + n] == batch.token_seq[t] &&
           batch.positions[t + n] == batch.positions[t] + n)
      ++n;
    const int context_len = batch.positions[t + n - 1] + 1;
    const int64_t kv_bytes = int64_t{context_len} * w.num_heads * layout.head_width * 2;
    if (n >= min_tokens && kv_bytes <= kExpandedMaxKvBytes && batch.slot_mapping[t] >= 0)
      chunks.push_back({t, n, context_len, table_offsets[batch.token_seq[t]]});
    t += n;
  }
  return chunks;
}

int num_expanded_tokens(const std::vector<ExpandedChunk>& chunks) {
  int n = 0;
  for (const ExpandedChunk& c : chunks) n += c.num_tokens;
  return n;
}

}  // namespace

// The fused kernel's warpgroup form takes DeepSeek's head widths, with the keys' rope columns
// read from the latent rows.
bool CudaBackend::expanded_rope_shared(const MlaWeights& w) const {
  return fused_prefill_attention_ && warpgroup_flash_attention_ &&
         flash_attention_wgmma_supported(w.qk_nope_head_dim, w.qk_rope_head_dim,
                                         static_cast<int>(round_up(w.v_head_dim, 16)));
}

// See ExpandedLayout and expanded_weight_offset_bytes for the layout of `derived`.
void CudaBackend::prepare(MlaWeights& w) {
  const int64_t heads = w.num_heads, vdim = w.v_head_dim, lora = w.kv_lora_rank, nope = w.qk_nope_head_dim;
  const int64_t rope = w.qk_rope_head_dim;
  std::vector<float> uk(heads * nope * lora), uv(heads * vdim * lora), uv_t(uv.size());
  to_host(w.w_uk, uk.data());
  to_host(w.w_uv, uv.data());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t v = 0; v < vdim; ++v)
      for (int64_t l = 0; l < lora; ++l) uv_t[(h * lora + l) * vdim + v] = uv[(h * vdim + v) * lora + l];
  const ExpandedLayout layout(w, expanded_rope_shared(w));
  const int64_t ld_up = layout.up_k;
  std::vector<uint16_t> up(heads * layout.head_width * ld_up, 0);
  const uint16_t one = f32_to_bf16(1.0f);
  for (int64_t h = 0; h < heads; ++h) {
    uint16_t* rows = up.data() + h * layout.head_width * ld_up;
    for (int64_t r = 0; r < nope; ++r)
      for (int64_t l = 0; l < lora; ++l) rows[r * ld_up + l] = f32_to_bf16(uk[(h * nope + r) * lora + l]);
    if (!layout.rope_shared)
      for (int64_t r = 0; r < rope; ++r) rows[(nope + r) * ld_up + lora + r] = one;
    for (int64_t v = 0; v < vdim; ++v)
      for (int64_t l = 0; l < lora; ++l)
        rows[(layout.key_cols + v) * ld_up + l] = f32_to_bf16(uv[(h * vdim + v) * lora + l]);
  }
  const size_t offset = expanded_weight_offset_bytes(w);
  w.derived = alloc_->persistent_bytes(offset + up.size() * sizeof(uint16_t));
  DS_CUDA_CHECK(cudaMemcpyAsync(w.derived.data, uv_t.data(), uv_t.size() * sizeof(float), cudaMemcpyHostToDevice,
                                stream_));
  DS_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(w.derived.data) + offset, up.data(),
                                up.size() * sizeof(uint16_t), cudaMemcpyHostToDevice, stream_));
  synchronize();
}

bool CudaBackend::expanded_form_allowed(const MlaWeights& w) const {
  // Not while the batch must be invariant (the form's summation order depends on the chunk) or is
  // being recorded (its plan is made on the host).
  return !batch_invariant_ && !recording_ && ExpandedLayout::supported(w);
}

// In a batch whose every token attends in the expanded form, the fused kernel reads the queries
// in bf16 with their rope columns rotated: the product writes bf16 rows, which the attention
// rotates where they are, instead of fp32 rows that a pass reads back to convert and rotate
// (a 4 × 4k prefill: 200 MB written and read less a layer, and a pass of 88 µs a rotation of 27).
void CudaBackend::mla_queries(const Tensor& x, const LinearWeight& wq, const MlaWeights& w, const ForwardBatch& batch,
                              Tensor& q) {
  query_rows_ = {};
  const int64_t rows = x.dim(0);
  // fp32 products (the precision mode) keep fp32 queries; a weight in two terms takes gemm's copy
  // of the rows.
  if (f32_products_ || (wq.weight.dtype != DType::kBF16 && wq.weight.dtype != DType::kF8E4M3) ||
      weight_terms(wq) != 1) {
    linear(x, wq, q);
    return;
  }
  const GemmWeight g = gemm_weight_of(wq);
  const ExpandedLayout layout(w, expanded_rope_shared(w));
  const int64_t q_width = int64_t{w.num_heads} * (w.qk_nope_head_dim + w.qk_rope_head_dim);
  // Anything unusual (shapes linear refuses, too) takes linear.
  const bool bf16_rows = rows > 0 && rows == batch.num_tokens && q.dim(0) == rows &&
                         x.dtype == DType::kF32 && q.dtype == DType::kF32 && x.dim(1) == wq.in_features &&
                         !wq.packed_gate_up && wq.out_features == q_width &&
                         q.dim(1) == q_width && layout.qk_padded * w.num_heads == q_width &&
                         g.n_padded == q_width && fused_prefill_attention_ &&
                         mla_rope_bf16_queries_supported(w.qk_nope_head_dim, w.qk_rope_head_dim) &&
                         flash_attention_supported(static_cast<int>(layout.qk_padded),
                                                   static_cast<int>(layout.v_padded)) &&
                         expanded_form_allowed(w) && library_gemm_takes(g, rows) &&
                         (g.scales == nullptr || library_fp8_scales(g, rows, /*out_bf16=*/true) != nullptr) &&
                         num_expanded_tokens(plan_expanded_chunks(batch, w, layout, expanded_min_tokens_)) == rows;
  if (!bf16_rows) {
    linear(x, wq, q);
    return;
  }
  // cuBLASLt's products apply no pending norm's factor.
  reconcile_norm({&x}, {&q});
  const Tensor xb = to_bf16_padded(x, g.k_padded);
  // e4m3 products write whole groups of rows.
  Tensor bf16 = alloc_->cached({round_up(rows, kLibraryFp8RowMultiple), q_width}, DType::kBF16);
  if (g.scales != nullptr) DS_CHECK(library_product_fp8(xb, rows, g, bf16.data, /*out_bf16=*/true));
  else matmul_->bf16(static_cast<const uint16_t*>(g.data), xb.as<uint16_t>(), bf16.data, rows, g.n_padded, g.k_padded,
                     /*y_bf16=*/true);
  query_rows_ = {q.data, bf16};
}

void CudaBackend::mla_queries_and_linear(const Tensor& x, const LinearWeight& wq, const MlaWeights& w,
                                         const ForwardBatch& batch, Tensor& q, const LinearWeight& w2, Tensor& out2) {
  // Steps of few rows write fp32 queries through linear (mla_queries keeps bf16 rows only for
  // steps whose products take cuBLASLt), so both products can share a launch.
  const bool packed = wq.weight.dtype == DType::kBF16 || wq.weight.dtype == DType::kF8E4M3;
  if (!f32_products_ && packed && x.dim(0) > 0 && few_row_gemm_takes(x.dim(0)) && !wq.packed_gate_up &&
      !w2.packed_gate_up && input_cols_padded(wq) == input_cols_padded(w2)) {
    query_rows_ = {};
    linear_pair(x, wq, q, w2, out2);
    return;
  }
  Backend::mla_queries_and_linear(x, wq, w, batch, q, w2, out2);
}

void CudaBackend::mla_attention(const MlaAttentionArgs& args) {
  reconcile_norm({args.q, args.kv_a}, {args.out});
  forget_normed_copy();
  const MlaWeights& w = *args.weights;
  DS_CHECK_MSG(!w.derived.empty(), "mla_attention: the layer's weights were not prepared (Backend::prepare)");
  const ForwardBatch& batch = *args.batch;
  const int num_tokens = batch.num_tokens;
  if (num_tokens == 0) return;
  MlaBatchView view{num_tokens, nullptr, nullptr, nullptr, nullptr, nullptr};
  Tensor d_ints;
  if (&batch == step_batch_) {
    view.positions = step_->field(StepBuffers::kPositions);
    view.token_seq = step_->field(StepBuffers::kTokenSeq);
    view.slot_mapping = step_->field(StepBuffers::kSlots);
    view.table_offsets = step_->field(StepBuffers::kTableOffsets);
    view.tables = step_->field(StepBuffers::kTables);
  } else {
    // A batch from outside a model step (tests): one upload of positions | token_seq |
    // slot_mapping | table_offsets | concatenated block tables.
    std::vector<int32_t> ints;
    ints.reserve(3 * num_tokens + batch.block_tables.size() * 9);
    ints.insert(ints.end(), batch.positions.begin(), batch.positions.end());
    ints.insert(ints.end(), batch.token_seq.begin(), batch.token_seq.end());
    ints.insert(ints.end(), batch.slot_mapping.begin(), batch.slot_mapping.end());
    int32_t offset = 0;
    for (const auto& table : batch.block_tables) {
      ints.push_back(offset);
      offset += static_cast<int32_t>(table.size());
    }
    for (const auto& table : batch.block_tables) ints.insert(ints.end(), table.begin(), table.end());
    d_ints = upload_ints(ints);
    const int32_t* base = d_ints.as<int32_t>();
    view.positions = base;
    view.token_seq = base + num_tokens;
    view.slot_mapping = base + 2 * num_tokens;
    view.table_offsets = base + 3 * num_tokens;
    view.tables = base + 3 * num_tokens + batch.block_tables.size();
  }
  const MlaDims dims = mla_dims(w, args.block_size, args.cache->format);
  const MlaCacheWrite cache_write{args.kv_a->as<float>(), w.kv_a_layernorm.as<float>(), args.latent_norm_eps,
                                  args.cache->data.data};

  // Prefill chunks of expanded_min_tokens_ or more go to the expanded form where it is allowed.
  const ExpandedLayout layout(w, expanded_rope_shared(w));
  const std::vector<ExpandedChunk> chunks = expanded_form_allowed(w)
                                                ? plan_expanded_chunks(batch, w, layout, expanded_min_tokens_)
                                                : std::vector<ExpandedChunk>{};
  // Queries that mla_queries kept in bf16 only (its fp32 rows unwritten): every token is in a chunk.
  QueryRows queries = std::exchange(query_rows_, QueryRows{});
  uint16_t* bf16_queries = queries.of == args.q->data ? queries.bf16.as<uint16_t>() : nullptr;
  DS_CHECK_MSG(bf16_queries == nullptr || num_expanded_tokens(chunks) == num_tokens,
               "mla_attention: queries kept in bf16 for a batch not all expanded");
  // A batch all in the absorbed form has that form write the cache (in steps of a few tokens,
  // beside its first product); otherwise the entries are written first.
  const bool absorbed_writes_cache = chunks.empty() && cache_write_beside_;
  if (!absorbed_writes_cache)
    launch_mla_cache_write(dims, view, cache_write, args.rope_cos->as<float>(), args.rope_sin->as<float>(), stream_);
  if (chunks.empty()) {
    // o_proj reads the output in bf16: in steps of a few tokens the attention's last product
    // writes that copy too, where the output needs no zero padding to whole tiles.
    Tensor& out = *args.out;
    const Bf16Rows copy = out.dim(1) % kLibraryFp8TileColumns == 0 ? start_normed_copy(out) : Bf16Rows{};
    if (!mla_absorbed(args, view, batch.token_seq, args.q->as<float>(), out.as<float>(), copy,
                      absorbed_writes_cache ? &cache_write : nullptr))
      forget_normed_copy();
    return;
  }
  // The chunks' keys and values in as few up-projections as their size allows: one product of
  // all their context rows instead of one per chunk (four of 4,096 rows a layer in a 4 × 4k
  // prefill).
  std::vector<char> expanded(num_tokens, 0);
  const int64_t kv_width = int64_t{w.num_heads} * layout.head_width;  // bf16 per context position
  for (size_t begin = 0; begin < chunks.size();) {
    std::vector<int> context_lens;
    std::vector<int32_t> table_offsets;
    int64_t group_bytes = 0;
    size_t end = begin;
    while (end < chunks.size() &&
           (end == begin || group_bytes + chunks[end].context_len * kv_width * 2 <= kExpandedMaxKvBytes)) {
      group_bytes += chunks[end].context_len * kv_width * 2;
      context_lens.push_back(chunks[end].context_len);
      table_offsets.push_back(chunks[end].table_offset);
      ++end;
    }
    const ExpandedKeysValues kv = mla_expanded_keys_values(args, view, context_lens, table_offsets);
    const uint16_t* chunk_kv = kv.kv.as<uint16_t>();
    const uint16_t* chunk_latent = kv.latent.as<uint16_t>();
    for (size_t i = begin; i < end; ++i) {
      const ExpandedChunk& c = chunks[i];
      mla_expanded(args, view, c.first_token, c.num_tokens, c.context_len, chunk_kv, chunk_latent, bf16_queries);
      chunk_kv += c.context_len * kv_width;
      chunk_latent += c.context_len * layout.ld_latent;
      std::fill(expanded.begin() + c.first_token, expanded.begin() + c.first_token + c.num_tokens, 1);
    }
    begin = end;
  }

  // The other tokens, compacted: [rows | positions | token_seq | slots] in one upload.
  std::vector<int32_t> rest;
  for (int t = 0; t < num_tokens; ++t)
    if (!expanded[t]) rest.push_back(t);
  const int num_rest = static_cast<int>(rest.size());
  if (num_rest == 0) return;
  std::vector<int32_t> ints(rest), rest_seq;
  for (int32_t t : rest) ints.push_back(batch.positions[t]);
  for (int32_t t : rest) rest_seq.push_back(batch.token_seq[t]);
  ints.insert(ints.end(), rest_seq.begin(), rest_seq.end());
  for (int32_t t : rest) ints.push_back(batch.slot_mapping[t]);
  Tensor d_rest = upload_ints(ints);
  const int32_t* rest_rows = d_rest.as<int32_t>();
  MlaBatchView rest_view{num_rest,        rest_rows + num_rest, rest_rows + 2 * num_rest, rest_rows + 3 * num_rest,
                         view.table_offsets, view.tables};
  const int64_t q_width = int64_t{w.num_heads} * (w.qk_nope_head_dim + w.qk_rope_head_dim);
  const int64_t out_width = int64_t{w.num_heads} * w.v_head_dim;
  Tensor q_rest = alloc_->cached({num_rest, q_width}, DType::kF32);
  Tensor out_rest = alloc_->cached({num_rest, out_width}, DType::kF32);
  launch_gather_rows(args.q->as<float>(), rest_rows, num_rest, q_width, q_rest.as<float>(), stream_);
  mla_absorbed(args, rest_view, rest_seq, q_rest.as<float>(), out_rest.as<float>(), Bf16Rows{});
  launch_scatter_rows(out_rest.as<float>(), rest_rows, num_rest, out_width, args.out->as<float>(), stream_);
}

bool CudaBackend::mla_absorbed(const MlaAttentionArgs& args, const MlaBatchView& view,
                               std::span<const int32_t> token_seq, const float* q, float* out, Bf16Rows out_bf16,
                               const MlaCacheWrite* cache_write) {
  const MlaWeights& w = *args.weights;
  const int num_tokens = view.num_tokens;
  const MlaDims dims = mla_dims(w, args.block_size, args.cache->format);
  // The split count depends on the batch's shape only (a recording replays it for any
  // contents): split the context when the blocks alone cannot fill the GPU (kSplitBlocksPerSm),
  // each token cutting its own context into that many slices. Batch-invariant mode cuts every
  // context into slices of a length fixed by the model instead, so a token's summation order is
  // the same in any batch.
  const int64_t work = static_cast<int64_t>(num_tokens) * w.num_heads;
  int num_splits = 1, split_len = 0;
  if (batch_invariant_) {
    // Slices of at least 256 positions, at most 64 of them for the model's longest context.
    const int64_t max_positions = args.rope_cos->dim(0);
    split_len = static_cast<int>(std::max<int64_t>(256, (max_positions + 64 * 256 - 1) / (64 * 256) * 256));
    num_splits = static_cast<int>((max_positions + split_len - 1) / split_len);
  }
  // Decode batches of head_tile_min_tokens_ tokens or more run in head tiles on tensor cores (up
  // to 16 heads of a token per block, sharing its cache reads; TF32 products), their work
  // balanced over the GPU whatever the mix of context lengths. Steps of 4 to 8 tokens take the
  // split path with its splits made by the tiles (few_token_tile_runs_ of them a token, without
  // the plan). Other smaller steps keep the fp32 kernel: their (token, head, split) blocks fill
  // the GPU without the tiles' fixed cost, and single-sequence decode at short contexts stays at
  // fp32 accuracy. Steps below the head tiles' size whose contexts are long take the few-token
  // tiles, whatever their number of tokens (long_context_runs).
  const bool tiles_allowed = !batch_invariant_ && mla_head_tiles_supported(dims);
  const int long_runs = tiles_allowed ? long_context_runs(num_tokens, *args.batch) : 0;
  const bool long_context = long_runs > 0;
  bool few_token_tiles = tiles_allowed && few_token_tile_runs_ > 0 &&
                         (long_context || (num_tokens >= few_token_tiles_min_tokens_ &&
                                           num_tokens <= few_token_tiles_max_tokens_));
  const bool head_tiles = tiles_allowed && !few_token_tiles && num_tokens >= head_tile_min_tokens_;
  // A long context's runs: as many a token as the tiles' blocks fill the GPU in one wave (33 at
  // batch 8 on the H100, where 64 were 2% slower than 32), up to what the contexts' length calls
  // for; past the split kernel's 64 only where at least twice as many fit, since the combine's
  // form for many runs costs more than a few runs more gain (batch 4 at 16k: 1.2% slower at 66).
  // The fp32 kernel's (token, head, split) blocks are small (four warps, a few KB of shared
  // memory), and a warp walks its positions one after another: many short splits finish sooner
  // than a few long ones, up to what fits on the GPU at once.
  // The head tiles' blocks a group of heads, also what recording_variant keys long contexts by.
  const int tile_blocks = tiles_allowed ? mla_head_tile_blocks(dims, num_sms_) : 0;
  if (tiles_allowed) head_tile_blocks_seen_ = tile_blocks;
  if (few_token_tiles && long_context) {
    num_splits = long_context_splits(long_runs, tile_blocks, num_tokens);
  } else if (few_token_tiles) {
    num_splits = few_token_tile_runs_;
  } else if (!batch_invariant_ && !head_tiles && work < kSplitBlocksPerSm * num_sms_) {
    num_splits = static_cast<int>(std::min<int64_t>((kSplitBlocksPerSm * num_sms_ + work - 1) / work, kMaxMlaSplits));
  }
  // Grids that fit in one wave at kSplitBlocksPerSm blocks an SM score four positions a warp at
  // once (127 registers: four blocks an SM), which took 1.1-1.5% off V2-Lite's batch-1 step;
  // larger ones (V2-Lite's batch 8: 640 blocks) keep one position at a time, whose 96 registers
  // fit five blocks an SM, where four at once were 9-11% slower. Batch-invariant steps keep one
  // at a time, so that a token's sums do not depend on the batch.
  int split_group = split_group_positions_;
  if (split_group == 0)
    split_group = !batch_invariant_ && work * num_splits <= kSplitBlocksPerSm * num_sms_ ? 4 : 1;
  // Prefill chunks (a sequence with 16 new tokens or more) go to the tensor-core kernel, which
  // reads each cache entry once per 16 queries; every token of the batch then runs in tiles.
  std::vector<int32_t> tiles;
  if (!batch_invariant_ && !recording_ && mla_tiles_supported(dims)) {
    bool long_chunk = false;
    for (int t = 0; t < num_tokens;) {
      int n = 1;
      while (t + n < num_tokens && n < kMlaTileRows && token_seq[t + n] == token_seq[t]) ++n;
      long_chunk = long_chunk || n == kMlaTileRows;
      tiles.push_back(t);
      tiles.push_back(n);
      t += n;
    }
    if (!long_chunk || tiles.size() / 2 > 65535) tiles.clear();
  }
  Tensor d_tiles;
  if (!tiles.empty()) {
    d_tiles = upload_ints(tiles);
    num_splits = query_tile_runs(static_cast<int>(tiles.size() / 2), w.num_heads, *args.batch);
    few_token_tiles = false;
  }
  // Head tiles balance the batch's work over a fixed number of blocks per head group, each
  // leaving one partial result per token it touched: at most blocks + tokens of them.
  const int head_tile_blocks = tiles.empty() && head_tiles ? tile_blocks : 0;
  const int64_t num_partials = head_tile_blocks > 0 ? (head_tile_blocks + num_tokens) * int64_t{w.num_heads}
                                                    : work * num_splits;
  Tensor workspace =
      alloc_->cached({tiles.empty() || num_splits > 1 ? num_partials * (w.kv_lora_rank + 2) : 1}, DType::kF32);
  Tensor work_starts = alloc_->cached({head_tile_blocks > 0 ? num_tokens + 1 : 1}, DType::kI32);
  Tensor q_latent = alloc_->cached({work * w.kv_lora_rank}, DType::kF32);
  Tensor o_latent = alloc_->cached({work * w.kv_lora_rank}, DType::kF32);
  return launch_mla_attention(dims, view, q, w.w_uk.as<float>(), w.derived.as<float>(), args.rope_cos->as<float>(),
                              args.rope_sin->as<float>(), args.cache->data.data, args.softmax_scale, num_splits,
                              split_len, workspace.as<float>(), q_latent.as<float>(), o_latent.as<float>(), out,
                              tiles.empty() ? nullptr : d_tiles.as<int32_t>(), static_cast<int>(tiles.size() / 2),
                              head_tile_blocks, work_starts.as<int32_t>(), !batch_invariant_, stream_,
                              out_bf16.data, out_bf16.ld, cache_write, fixed_split_forms_, split_group,
                              few_token_tiles, few_token_tiles_early_, merge_beside_max_tokens_,
                              attention_weights_l2_evict_first_);
}

int CudaBackend::long_context_runs(int64_t num_tokens, const ForwardBatch& batch) const {
  if (batch_invariant_ || few_token_tile_runs_ == 0 || long_context_tiles_min_positions_ == 0 ||
      num_tokens >= head_tile_min_tokens_)
    return 0;
  // Steps that take the few-token tiles anyway change only their runs, which gain where a
  // context alone is long (batch 4 on the H100: 1k contexts 0.9% slower at 64 runs than at 32,
  // 4k ones 1.8% faster).
  const bool in_few_token_tiles =
      num_tokens >= few_token_tiles_min_tokens_ && num_tokens <= few_token_tiles_max_tokens_;
  int64_t num_positions = 0, longest = 0;
  for (int32_t len : batch.context_lens) {
    num_positions += len;
    longest = std::max<int64_t>(longest, len);
  }
  if ((in_few_token_tiles ? longest : num_positions) < long_context_tiles_min_positions_) return 0;
  // Runs of at least kLongContextRunPositions positions of the longest context, in powers of two
  // from the split kernel's 64 up to long_context_max_runs_.
  int runs = kMaxMlaSplits;
  while (runs < long_context_max_runs_ && longest >= int64_t{2} * runs * kLongContextRunPositions) runs *= 2;
  return std::min(runs, long_context_max_runs_);
}

int CudaBackend::query_tile_runs(int num_tiles, int num_heads, const ForwardBatch& batch) const {
  if (query_tile_blocks_per_sm_ == 0) return 1;
  int64_t longest = 0;
  for (int32_t len : batch.context_lens) longest = std::max<int64_t>(longest, len);
  const int64_t blocks = int64_t{num_tiles} * num_heads;
  const int64_t wanted = (int64_t{query_tile_blocks_per_sm_} * num_sms_ + blocks - 1) / blocks;
  const int64_t most = std::max<int64_t>(1, longest / kQueryTileRunPositions);
  return static_cast<int>(std::clamp<int64_t>(std::min(wanted, most), 1, kMaxMlaSplits));
}

int CudaBackend::long_context_splits(int long_runs, int head_tile_blocks, int64_t num_tokens) {
  int num_splits = static_cast<int>(std::clamp<int64_t>(head_tile_blocks / num_tokens, 1, long_runs));
  if (num_splits < 2 * kMaxMlaSplits) num_splits = std::min(num_splits, kMaxMlaSplits);
  return num_splits;
}

uint32_t CudaBackend::recording_variant(const ForwardBatch& batch) const {
  const int runs = long_context_runs(batch.num_tokens, batch);
  if (runs == 0 || head_tile_blocks_seen_ == 0) return static_cast<uint32_t>(runs);
  return static_cast<uint32_t>(long_context_splits(runs, head_tile_blocks_seen_, batch.num_tokens));
}

// latent = each context's cache entries (bf16, one after another), kv = latent · W_upᵀ.
CudaBackend::ExpandedKeysValues CudaBackend::mla_expanded_keys_values(const MlaAttentionArgs& args,
                                                                      const MlaBatchView& view,
                                                                      std::span<const int> context_lens,
                                                                      std::span<const int32_t> table_offsets) {
  const MlaWeights& w = *args.weights;
  const ExpandedLayout layout(w, expanded_rope_shared(w));
  const MlaDims dims = mla_dims(w, args.block_size, args.cache->format);
  int64_t num_rows = 0;
  for (int n : context_lens) num_rows += n;
  Tensor latent = alloc_->cached({num_rows, layout.ld_latent}, DType::kBF16);
  uint16_t* rows = latent.as<uint16_t>();
  for (size_t i = 0; i < context_lens.size(); ++i) {
    launch_mla_gather_latent(dims, args.cache->data.data, view.tables + table_offsets[i], context_lens[i],
                             static_cast<int>(layout.ld_latent), rows, stream_);
    rows += int64_t{context_lens[i]} * layout.ld_latent;
  }
  const int64_t kv_width = w.num_heads * layout.head_width;
  Tensor kv = alloc_->cached({num_rows, kv_width}, DType::kBF16);
  LtMatmul::Strided up;
  up.m = num_rows;
  up.n = kv_width;
  up.k = layout.up_k;
  up.y_bf16 = true;
  up.ld_x = layout.ld_latent;
  up.ld_w = layout.up_k;
  up.ld_y = kv_width;
  const auto* w_up =
      reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(w.derived.data) + expanded_weight_offset_bytes(w));
  matmul_->bf16_strided(up, latent.as<uint16_t>(), w_up, kv.data);
  return {kv, latent};
}

// One sequence's chunk of new tokens [first_token, first_token + num_tokens), the last tokens of
// its context_len positions, whose keys and values are at kv and latent rows at latent: per block
// of query rows, scores = Q · Kᵀ per head, causal softmax, out rows = P · V per head.
void CudaBackend::mla_expanded(const MlaAttentionArgs& args, const MlaBatchView& view, int first_token,
                               int num_tokens, int context_len, const uint16_t* kv, const uint16_t* latent,
                               uint16_t* bf16_queries) {
  const MlaWeights& w = *args.weights;
  const ExpandedLayout layout(w, expanded_rope_shared(w));
  const int heads = w.num_heads, vdim = w.v_head_dim;
  const int first_pos = context_len - num_tokens;
  const MlaDims dims = mla_dims(w, args.block_size, args.cache->format);
  const int64_t kv_width = heads * layout.head_width;

  const int64_t q_width = heads * layout.qk_padded;
  const int64_t q_in_width = int64_t{heads} * (w.qk_nope_head_dim + w.qk_rope_head_dim);
  Tensor queries;
  const uint16_t* chunk_queries = nullptr;
  if (bf16_queries != nullptr) {  // the projection's bf16 rows, rotated where they are
    uint16_t* rows = bf16_queries + first_token * q_in_width;
    launch_mla_rope_bf16_queries(dims, rows, view.positions + first_token, num_tokens, args.rope_cos->as<float>(),
                                 args.rope_sin->as<float>(), stream_);
    chunk_queries = rows;
  } else {
    queries = alloc_->cached({num_tokens, q_width}, DType::kBF16);
    launch_mla_expanded_queries(dims, args.q->as<float>() + first_token * q_in_width, view.positions + first_token,
                                num_tokens, args.rope_cos->as<float>(), args.rope_sin->as<float>(),
                                static_cast<int>(layout.qk_padded), queries.as<uint16_t>(), stream_);
    chunk_queries = queries.as<uint16_t>();
  }

  float* out = args.out->as<float>() + int64_t{first_token} * heads * vdim;
  if (fused_prefill_attention_ && flash_attention_supported(static_cast<int>(layout.qk_padded),
                                                            static_cast<int>(layout.v_padded))) {
    launch_expanded_flash_attention(chunk_queries, kv, layout.rope_shared ? latent + w.kv_lora_rank : nullptr,
                                    layout.ld_latent, heads, static_cast<int>(layout.qk_padded),
                                    static_cast<int>(layout.v_padded), vdim, num_tokens, first_pos, context_len,
                                    args.softmax_scale, out, int64_t{heads} * vdim, stream_);
    return;
  }
  DS_CHECK(!layout.rope_shared);  // the layout of the fused kernel's warpgroup form only
  DS_CHECK(bf16_queries == nullptr);  // kept in bf16 for the fused kernel only (mla_queries)
  // Otherwise per-head products through cuBLASLt, with the scores and probabilities in memory.
  const int64_t max_ld = round_up(context_len, 8);
  const int rows_per_block = static_cast<int>(std::clamp<int64_t>(kExpandedScoreElements / (heads * max_ld), 16,
                                                                  kExpandedMaxQueryRows));
  const int block_rows = std::min(rows_per_block, num_tokens);
  Tensor scores = alloc_->cached({heads * block_rows * max_ld}, DType::kF32);
  Tensor probs = alloc_->cached({heads * block_rows * max_ld}, DType::kBF16);
  for (int i0 = 0; i0 < num_tokens; i0 += block_rows) {
    const int rows = std::min(block_rows, num_tokens - i0);
    const int num_keys = first_pos + i0 + rows;
    const int64_t ld = round_up(num_keys, 8);
    LtMatmul::Strided qk;
    qk.m = rows;
    qk.n = num_keys;
    qk.k = layout.qk_padded;
    qk.batch = heads;
    qk.ld_x = q_width;
    qk.stride_x = layout.qk_padded;
    qk.ld_w = kv_width;
    qk.stride_w = layout.head_width;
    qk.ld_y = ld;
    qk.stride_y = rows * ld;
    matmul_->bf16_strided(qk, chunk_queries + int64_t{i0} * q_width, kv, scores.data);
    launch_causal_softmax(scores.as<float>(), ld, heads, rows, num_keys, first_pos + i0, args.softmax_scale,
                          probs.as<uint16_t>(), stream_);
    LtMatmul::Strided pv;
    pv.m = rows;
    pv.n = vdim;
    pv.k = num_keys;
    pv.batch = heads;
    pv.w_rows_are_n = false;
    pv.ld_x = ld;
    pv.stride_x = rows * ld;
    pv.ld_w = kv_width;
    pv.stride_w = layout.head_width;
    pv.ld_y = int64_t{heads} * vdim;
    pv.stride_y = vdim;
    matmul_->bf16_strided(pv, probs.as<uint16_t>(), kv + layout.key_cols, out + int64_t{i0} * heads * vdim);
  }
}

}  // namespace dsinfer::cuda
