// The CUDA backend's MLA attention and MoE: host-side planning around the kernels of
// cuda_attention.cu and cuda_moe.cu.
#include <algorithm>
#include <climits>
#include <map>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_state.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/lt_matmul.h"

namespace dsinfer::cuda {
namespace {
// From this many routed rows per expert on average (prefill), an MoE layer plans its expert
// GEMMs on the host; below it (decode) everything stays on the device.
constexpr int64_t kHostPlannedRowsPerExpert = 32;
}  // namespace

void CudaBackend::mla_attention(const MlaAttentionArgs& args) {
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
  const MlaDims dims{w.num_heads, w.kv_lora_rank, w.qk_nope_head_dim, w.qk_rope_head_dim, w.v_head_dim,
                     args.block_size};
  float* cache = args.cache->data.as<float>();
  launch_mla_cache_write(dims, view, args.kv_a->as<float>(), w.kv_a_layernorm.as<float>(), args.latent_norm_eps,
                         args.rope_cos->as<float>(), args.rope_sin->as<float>(), cache, stream_);

  // The split count depends on the batch's shape only (a recording replays it for any
  // contents): split the context when (token, head) blocks alone cannot fill the GPU twice
  // over, each token cutting its own context into that many slices. Batch-invariant mode cuts
  // every context into slices of a length fixed by the model instead, so a token's summation
  // order is the same in any batch.
  const int64_t work = static_cast<int64_t>(num_tokens) * w.num_heads;
  int num_splits = 1, split_len = 0;
  if (batch_invariant_) {
    // Slices of at least 256 positions, at most 64 of them for the model's longest context.
    const int64_t max_positions = args.rope_cos->dim(0);
    split_len = static_cast<int>(std::max<int64_t>(256, (max_positions + 64 * 256 - 1) / (64 * 256) * 256));
    num_splits = static_cast<int>((max_positions + split_len - 1) / split_len);
  } else if (work < 2 * num_sms_) {
    num_splits = static_cast<int>(std::min<int64_t>((2 * num_sms_ + work - 1) / work, 64));
  }
  // Prefill chunks (a sequence with 16 new tokens or more) go to the tensor-core kernel, which
  // reads each cache entry once per 16 queries; every token of the batch then runs in tiles.
  std::vector<int32_t> tiles;
  if (!batch_invariant_ && !recording_ && mla_prefill_supported(dims)) {
    bool long_chunk = false;
    for (int t = 0; t < num_tokens;) {
      int n = 1;
      while (t + n < num_tokens && n < kMlaPrefillTileTokens && batch.token_seq[t + n] == batch.token_seq[t]) ++n;
      long_chunk = long_chunk || n == kMlaPrefillTileTokens;
      tiles.push_back(t);
      tiles.push_back(n);
      t += n;
    }
    if (!long_chunk || tiles.size() / 2 > 65535) tiles.clear();
  }
  Tensor d_tiles;
  if (!tiles.empty()) {
    d_tiles = upload_ints(tiles);
    num_splits = 1;
  }
  Tensor workspace = alloc_->cached({tiles.empty() ? work * num_splits * (w.kv_lora_rank + 2) : 1}, DType::kF32);
  Tensor q_latent = alloc_->cached({work * w.kv_lora_rank}, DType::kF32);
  Tensor o_latent = alloc_->cached({work * w.kv_lora_rank}, DType::kF32);
  launch_mla_attention(dims, view, args.q->as<float>(), w.w_uk.as<float>(), w.derived.as<float>(),
                       args.rope_cos->as<float>(), args.rope_sin->as<float>(), cache, args.softmax_scale, num_splits,
                       split_len, workspace.as<float>(), q_latent.as<float>(), o_latent.as<float>(),
                       args.out->as<float>(), tiles.empty() ? nullptr : d_tiles.as<int32_t>(),
                       static_cast<int>(tiles.size() / 2), stream_);
}

// W_UV transposed per head, [heads, kv_lora_rank, v_head_dim], for the output projection's
// per-head GEMM (coalesced along v).
void CudaBackend::prepare(MlaWeights& w) {
  const int64_t heads = w.num_heads, vdim = w.v_head_dim, lora = w.kv_lora_rank;
  std::vector<float> uv(heads * vdim * lora), uv_t(uv.size());
  to_host(w.w_uv, uv.data());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t v = 0; v < vdim; ++v)
      for (int64_t l = 0; l < lora; ++l) uv_t[(h * lora + l) * vdim + v] = uv[(h * vdim + v) * lora + l];
  w.derived = alloc_->persistent({heads, lora, vdim}, DType::kF32);
  DS_CUDA_CHECK(cudaMemcpyAsync(w.derived.data, uv_t.data(), w.derived.num_bytes(), cudaMemcpyHostToDevice, stream_));
  synchronize();
}

// Device descriptors of a layer's expert weights, [gate_up of each expert | down of each expert].
void CudaBackend::prepare(MoeWeights& w) {
  const int num_experts = w.num_experts;
  DS_CHECK(static_cast<int>(w.expert_gate_up.size()) == num_experts &&
           static_cast<int>(w.expert_down.size()) == num_experts && num_experts > 0);
  std::vector<GemmWeight> table;
  for (const LinearWeight& gu : w.expert_gate_up) {
    DS_CHECK_MSG(gu.packed_gate_up, "MoE expert gate/up weights must come from make_gate_up");
    table.push_back(gemm_weight_of(gu));
  }
  for (const LinearWeight& d : w.expert_down) table.push_back(gemm_weight_of(d));
  for (int e = 1; e < num_experts; ++e) {
    DS_CHECK_MSG(table[e].n_padded == table[0].n_padded && table[e].k_padded == table[0].k_padded &&
                     (table[e].scales == nullptr) == (table[0].scales == nullptr) &&
                     table[num_experts + e].n_padded == table[num_experts].n_padded &&
                     table[num_experts + e].k_padded == table[num_experts].k_padded &&
                     (table[num_experts + e].scales == nullptr) == (table[num_experts].scales == nullptr),
                 "MoE experts of one layer must share shapes and dtype");
  }
  const size_t bytes = table.size() * sizeof(GemmWeight);
  w.derived = alloc_->persistent_bytes(bytes);
  DS_CUDA_CHECK(cudaMemcpyAsync(w.derived.data, table.data(), bytes, cudaMemcpyHostToDevice, stream_));
  synchronize();
}

void CudaBackend::moe(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing) {
  const int64_t num_tokens = x.dim(0), hidden = x.dim(1);
  const int top_k = w.top_k, num_experts = w.num_experts;
  if (num_tokens == 0) return;
  const int64_t num_entries = num_tokens * top_k;
  DS_CHECK_MSG(num_entries <= INT32_MAX / 2, "MoE: " << num_entries << " routed entries in one step");
  MoeRouteParams params{num_experts,
                        top_k,
                        w.num_groups,
                        w.topk_groups,
                        w.scoring == GateScoring::kSigmoid,
                        w.topk_method == GateTopk::kGreedy               ? 0
                        : w.topk_method == GateTopk::kGroupLimitedGreedy ? 1
                                                                         : 2,
                        w.norm_topk_prob,
                        w.routed_scaling_factor};
  Tensor d_ids = alloc_->cached({num_entries}, DType::kI32);
  Tensor d_weights = alloc_->cached({num_entries}, DType::kF32);
  const float* bias = w.score_correction_bias.empty() ? nullptr : w.score_correction_bias.as<float>();
  Tensor logits = alloc_->cached({num_tokens, num_experts}, DType::kF32);
  if (!batch_invariant_ && num_tokens > own_gemm_max_rows_)
    matmul_->f32(w.gate.as<float>(), x.as<float>(), logits.as<float>(), num_tokens, num_experts, hidden);
  else
    launch_router_logits(x.as<float>(), w.gate.as<float>(), num_tokens, static_cast<int>(hidden), num_experts,
                         logits.as<float>(), stream_);
  launch_moe_route(logits.as<float>(), num_tokens, params, bias, d_ids.as<int32_t>(), d_weights.as<float>(), stream_);

  // plan = [row_offsets E+1 | block_offsets E+1 | src_rows | slot_rows]
  Tensor plan = alloc_->cached({2 * (num_experts + 1) + 2 * num_entries}, DType::kI32);
  int32_t* row_offsets = plan.as<int32_t>();
  int32_t* block_offsets = row_offsets + num_experts + 1;
  int32_t* src_rows = block_offsets + num_experts + 1;
  int32_t* slot_rows = src_rows + num_entries;
  launch_moe_plan(d_ids.as<int32_t>(), static_cast<int>(num_entries), top_k, num_experts, kGemmRowsPerBlock,
                  row_offsets, block_offsets, src_rows, slot_rows, stream_);

  DS_CHECK_MSG(!w.derived.empty(), "moe: the layer's weights were not prepared (Backend::prepare)");
  const LinearWeight& gu0 = w.expert_gate_up[0];
  const LinearWeight& down0 = w.expert_down[0];
  const int64_t k_p = gu0.weight.dim(1), inter_p = gu0.weight.dim(0) / 2;
  DS_CHECK(down0.weight.dim(1) == inter_p && down0.out_features == hidden && gu0.in_features == hidden);
  Tensor xb = to_bf16_padded(x, k_p);
  Tensor expert_out = alloc_->cached({num_entries, hidden}, DType::kF32);
  if (!batch_invariant_ && !recording_ && num_entries >= kHostPlannedRowsPerExpert * num_experts) {
    moe_experts_host_planned(w, x, row_offsets, src_rows, num_entries, expert_out);
  } else {
    moe_experts_grouped(w, xb, row_offsets, block_offsets, src_rows, num_entries, expert_out);
  }

  Tensor shared;
  if (w.has_shared) {
    DS_CHECK(w.shared_gate_up.weight.dim(1) == k_p);
    shared = alloc_->cached({num_tokens, hidden}, DType::kF32);
    gated_mlp_bf16(xb, num_tokens, w.shared_gate_up, w.shared_down, shared.as<float>(), hidden);
  }
  launch_moe_combine(expert_out.as<float>(), slot_rows, d_weights.as<float>(),
                     shared.empty() ? nullptr : shared.as<float>(), num_tokens, top_k, hidden, out.as<float>(),
                     stream_);

  if (routing != nullptr) {
    routing->expert_ids.resize(num_entries);
    routing->weights.resize(num_entries);
    DS_CUDA_CHECK(cudaMemcpyAsync(routing->expert_ids.data(), d_ids.data, num_entries * 4, cudaMemcpyDeviceToHost,
                                  stream_));
    DS_CUDA_CHECK(cudaMemcpyAsync(routing->weights.data(), d_weights.data, num_entries * 4, cudaMemcpyDeviceToHost,
                                  stream_));
    synchronize();
  }
}

// All experts in two grouped GEMMs that read the routing from the device (no host wait).
void CudaBackend::moe_experts_grouped(const MoeWeights& w, const Tensor& xb, const int32_t* row_offsets,
                                      const int32_t* block_offsets, const int32_t* src_rows, int64_t num_entries,
                                      Tensor& expert_out) {
  const int num_experts = w.num_experts;
  const GemmWeight* gate_up_table = static_cast<const GemmWeight*>(w.derived.data);
  const LinearWeight& gu0 = w.expert_gate_up[0];
  const LinearWeight& down0 = w.expert_down[0];
  const int64_t k_p = gu0.weight.dim(1), inter_p = gu0.weight.dim(0) / 2, hidden = down0.out_features;
  const int max_blocks = static_cast<int>((num_entries + kGemmRowsPerBlock - 1) / kGemmRowsPerBlock + num_experts);
  const int rows_hint = static_cast<int>((num_entries + num_experts - 1) / num_experts);

  Tensor act = alloc_->cached({num_entries, inter_p}, DType::kBF16);
  GroupedGemmArgs up;
  up.x = xb.as<uint16_t>();
  up.ldx = k_p;
  up.src_rows = src_rows;
  up.groups = gate_up_table;
  up.row_offsets = row_offsets;
  up.block_offsets = block_offsets;
  up.num_groups = num_experts;
  up.weights_fp8 = gu0.weight.dtype == DType::kF8E4M3;
  up.epilogue = GemmEpilogue::kSiluMulBf16;
  up.y = act.data;
  up.ldy = inter_p;
  up.n_out = static_cast<int>(inter_p);
  launch_grouped_gemm(up, static_cast<int>(gu0.weight.dim(0)), max_blocks, rows_hint, stream_);

  GroupedGemmArgs down = up;
  down.x = act.as<uint16_t>();
  down.ldx = inter_p;
  down.src_rows = nullptr;
  down.groups = gate_up_table + num_experts;
  down.weights_fp8 = down0.weight.dtype == DType::kF8E4M3;
  down.epilogue = GemmEpilogue::kStoreF32;
  down.y = expert_out.data;
  down.ldy = hidden;
  down.n_out = static_cast<int>(hidden);
  launch_grouped_gemm(down, static_cast<int>(down0.weight.dim(0)), max_blocks, rows_hint, stream_);
}

// Prefill-sized batches: the experts' row counts come to the host (one wait per layer) and
// each expert's rows run as plain GEMMs, which cuBLASLt tiles far better than the decode
// kernel once an expert has hundreds of rows.
void CudaBackend::moe_experts_host_planned(const MoeWeights& w, const Tensor& x, const int32_t* row_offsets,
                                           const int32_t* src_rows, int64_t num_entries, Tensor& expert_out) {
  const int num_experts = w.num_experts;
  std::vector<int32_t> offsets(num_experts + 1);
  DS_CUDA_CHECK(cudaMemcpyAsync(offsets.data(), row_offsets, offsets.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                stream_));
  synchronize();
  const int64_t hidden = x.dim(1);
  Tensor xe = alloc_->cached({num_entries, hidden}, DType::kF32);
  launch_gather_rows(x.as<float>(), src_rows, num_entries, hidden, xe.as<float>(), stream_);
  const LinearWeight& gu0 = w.expert_gate_up[0];
  const int64_t k_p = gu0.weight.dim(1), inter_p = gu0.weight.dim(0) / 2;
  Tensor xeb = to_bf16_padded(xe, k_p);
  Tensor act = alloc_->cached({num_entries, inter_p}, DType::kBF16);
  for (int e = 0; e < num_experts; ++e) {
    const int64_t begin = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    Tensor x_rows = view_rows(xeb, begin, n);
    void* act_rows = act.as<uint16_t>() + begin * inter_p;
    gemm(x_rows, n, w.expert_gate_up[e], static_cast<int>(GemmEpilogue::kSiluMulBf16), act_rows, inter_p, inter_p,
         /*library_gemm=*/true);
    Tensor a_rows = view_rows(act, begin, n);
    gemm(a_rows, n, w.expert_down[e], static_cast<int>(GemmEpilogue::kStoreF32),
         expert_out.as<float>() + begin * hidden, hidden, hidden, /*library_gemm=*/true);
  }
}

}  // namespace dsinfer::cuda
