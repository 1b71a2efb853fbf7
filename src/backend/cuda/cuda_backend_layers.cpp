// The CUDA backend's MLA attention and MoE: host-side planning around the kernels of
// cuda_attention.cu and cuda_moe.cu.
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/lt_matmul.h"

namespace dsinfer::cuda {

void CudaBackend::mla_attention(const MlaAttentionArgs& args) {
  const MlaWeights& w = *args.weights;
  const ForwardBatch& batch = *args.batch;
  const int num_tokens = batch.num_tokens;
  if (num_tokens == 0) return;
  // One upload for the step's token layout: positions | token_seq | slot_mapping |
  // table_offsets | concatenated block tables.
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
  Tensor d_ints = upload_ints(ints);
  const int32_t* base = d_ints.as<int32_t>();
  MlaBatchView view{num_tokens,
                    base,
                    base + num_tokens,
                    base + 2 * num_tokens,
                    base + 3 * num_tokens,
                    base + 3 * num_tokens + batch.block_tables.size()};
  const MlaDims dims{w.num_heads, w.kv_lora_rank, w.qk_nope_head_dim, w.qk_rope_head_dim, w.v_head_dim,
                     args.block_size};
  float* cache = args.cache->data.as<float>();
  launch_mla_cache_write(dims, view, args.kv_a->as<float>(), w.kv_a_layernorm.as<float>(), args.latent_norm_eps,
                         args.rope_cos->as<float>(), args.rope_sin->as<float>(), cache, stream_);

  // Split the context only when (token, head) blocks alone cannot fill the GPU twice over,
  // keeping at least 64 positions per split.
  const int max_ctx = *std::max_element(batch.positions.begin(), batch.positions.end()) + 1;
  const int64_t work = static_cast<int64_t>(num_tokens) * w.num_heads;
  int num_splits = 1;
  if (work < 2 * num_sms_) {
    num_splits = static_cast<int>((2 * num_sms_ + work - 1) / work);
    num_splits = std::min({num_splits, (max_ctx + 63) / 64, 64});
    num_splits = std::max(num_splits, 1);
  }
  const int split_len = (max_ctx + num_splits - 1) / num_splits;
  Tensor workspace = alloc_->cached({work * num_splits * (w.kv_lora_rank + 2)}, DType::kF32);
  launch_mla_attention(dims, view, args.q->as<float>(), w.w_uk.as<float>(), w.w_uv.as<float>(),
                       args.rope_cos->as<float>(), args.rope_sin->as<float>(), cache, args.softmax_scale, num_splits,
                       split_len, workspace.as<float>(), args.out->as<float>(), stream_);
}

void CudaBackend::moe(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing) {
  const int64_t num_tokens = x.dim(0), hidden = x.dim(1);
  const int top_k = w.top_k;
  if (num_tokens == 0) return;
  Tensor logits = alloc_->cached({num_tokens, w.num_experts}, DType::kF32);
  matmul_->f32(w.gate.as<float>(), x.as<float>(), logits.as<float>(), num_tokens, w.num_experts, hidden);
  MoeRouteParams params{w.num_experts,
                        top_k,
                        w.num_groups,
                        w.topk_groups,
                        w.scoring == GateScoring::kSigmoid,
                        w.topk_method == GateTopk::kGreedy               ? 0
                        : w.topk_method == GateTopk::kGroupLimitedGreedy ? 1
                                                                         : 2,
                        w.norm_topk_prob,
                        w.routed_scaling_factor};
  Tensor d_ids = alloc_->cached({num_tokens, top_k}, DType::kI32);
  Tensor d_weights = alloc_->cached({num_tokens, top_k}, DType::kF32);
  const float* bias = w.score_correction_bias.empty() ? nullptr : w.score_correction_bias.as<float>();
  launch_moe_route(logits.as<float>(), num_tokens, params, bias, d_ids.as<int32_t>(), d_weights.as<float>(), stream_);

  // The per-expert GEMMs are planned on the host: group the (token, slot) entries by expert.
  const int64_t num_entries = num_tokens * top_k;
  std::vector<int32_t> ids(num_entries);
  DS_CUDA_CHECK(cudaMemcpyAsync(ids.data(), d_ids.data, num_entries * 4, cudaMemcpyDeviceToHost, stream_));
  synchronize();
  std::vector<int64_t> begin(w.num_experts + 1, 0);
  for (int32_t e : ids) ++begin[e + 1];
  for (int e = 0; e < w.num_experts; ++e) begin[e + 1] += begin[e];
  // plan = [source token of each grouped row | grouped row of each entry]
  std::vector<int32_t> plan(2 * num_entries);
  std::vector<int64_t> fill(begin.begin(), begin.end() - 1);
  for (int64_t i = 0; i < num_entries; ++i) {
    const int64_t row = fill[ids[i]]++;
    plan[row] = static_cast<int32_t>(i / top_k);
    plan[num_entries + i] = static_cast<int32_t>(row);
  }
  Tensor d_plan = upload_ints(plan);
  Tensor xe = alloc_->cached({num_entries, hidden}, DType::kF32);
  launch_gather_rows(x.as<float>(), d_plan.as<int32_t>(), num_entries, hidden, xe.as<float>(), stream_);

  const int64_t inter = w.expert_gate_up.at(0).out_features / 2;
  Tensor gate_up = alloc_->cached({num_entries, 2 * inter}, DType::kF32);
  Tensor act = alloc_->cached({num_entries, inter}, DType::kF32);
  Tensor expert_out = alloc_->cached({num_entries, hidden}, DType::kF32);
  for (int e = 0; e < w.num_experts; ++e) {
    const int64_t n = begin[e + 1] - begin[e];
    if (n == 0) continue;
    Tensor gu = view_rows(gate_up, begin[e], n);
    linear(view_rows(xe, begin[e], n), w.expert_gate_up[e], gu);
  }
  launch_silu_mul(gate_up.as<float>(), num_entries, inter, act.as<float>(), stream_);
  for (int e = 0; e < w.num_experts; ++e) {
    const int64_t n = begin[e + 1] - begin[e];
    if (n == 0) continue;
    Tensor y = view_rows(expert_out, begin[e], n);
    linear(view_rows(act, begin[e], n), w.expert_down[e], y);
  }
  launch_moe_combine(expert_out.as<float>(), d_plan.as<int32_t>() + num_entries, d_weights.as<float>(), num_tokens,
                     top_k, hidden, out.as<float>(), stream_);

  if (w.has_shared) {
    const int64_t shared_inter = w.shared_gate_up.out_features / 2;
    Tensor sgu = alloc_->cached({num_tokens, 2 * shared_inter}, DType::kF32);
    linear(x, w.shared_gate_up, sgu);
    Tensor sact = alloc_->cached({num_tokens, shared_inter}, DType::kF32);
    launch_silu_mul(sgu.as<float>(), num_tokens, shared_inter, sact.as<float>(), stream_);
    Tensor shared = alloc_->cached({num_tokens, hidden}, DType::kF32);
    linear(sact, w.shared_down, shared);
    add(out, shared);
  }
  if (routing != nullptr) {
    routing->expert_ids = std::move(ids);
    routing->weights.resize(num_entries);
    DS_CUDA_CHECK(cudaMemcpyAsync(routing->weights.data(), d_weights.data, num_entries * 4, cudaMemcpyDeviceToHost,
                                  stream_));
    synchronize();
  }
}

}  // namespace dsinfer::cuda
