// Mixture of experts on the CPU: route every token (all gate variants of DeepSeek V2/V3), run
// each expert over the rows routed to it, combine per token in its own routing order, add the
// shared experts.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_matmul.h"
#include "core/check.h"
#include "core/thread_pool.h"

namespace dsinfer {
namespace cpu {
namespace {

// Indices of the k largest values, largest first; ties go to the lower index.
void top_k_indices(const float* v, int n, int k, int* out) {
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy(idx.begin(), idx.begin() + k, out);
}

}  // namespace

void route_token(const float* logits, const MoeWeights& w, int32_t* expert_ids, float* weights) {
  const int num_experts = w.num_experts;
  std::vector<float> scores(num_experts);
  if (w.scoring == GateScoring::kSoftmax) {
    const float mx = *std::max_element(logits, logits + num_experts);
    double sum = 0.0;
    for (int e = 0; e < num_experts; ++e) sum += scores[e] = std::exp(logits[e] - mx);
    for (int e = 0; e < num_experts; ++e) scores[e] = static_cast<float>(scores[e] / sum);
  } else {
    for (int e = 0; e < num_experts; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  }
  // Selection scores: biased for noaux_tc (the bias steers selection only).
  std::vector<float> choice = scores;
  if (w.topk_method == GateTopk::kNoauxTc && !w.score_correction_bias.empty()) {
    const float* bias = w.score_correction_bias.as<float>();
    for (int e = 0; e < num_experts; ++e) choice[e] += bias[e];
  }
  if (w.topk_method != GateTopk::kGreedy && w.num_groups > 1) {
    const int per_group = num_experts / w.num_groups;
    std::vector<float> group_scores(w.num_groups);
    for (int g = 0; g < w.num_groups; ++g) {
      const float* s = choice.data() + g * per_group;
      if (w.topk_method == GateTopk::kNoauxTc) {  // sum of the group's top two
        int top2[2];
        const int k = std::min(2, per_group);
        top_k_indices(s, per_group, k, top2);
        group_scores[g] = s[top2[0]] + (k > 1 ? s[top2[1]] : 0.0f);
      } else {  // group_limited_greedy: the group's best score
        group_scores[g] = *std::max_element(s, s + per_group);
      }
    }
    std::vector<int> keep(w.topk_groups);
    top_k_indices(group_scores.data(), w.num_groups, w.topk_groups, keep.data());
    std::vector<bool> kept(w.num_groups, false);
    for (int g : keep) kept[g] = true;
    for (int e = 0; e < num_experts; ++e)
      if (!kept[e / per_group]) choice[e] = -INFINITY;
  }
  std::vector<int> chosen(w.top_k);
  top_k_indices(choice.data(), num_experts, w.top_k, chosen.data());
  float sum = 0.0f;
  for (int i = 0; i < w.top_k; ++i) {
    expert_ids[i] = chosen[i];
    weights[i] = scores[chosen[i]];
    sum += weights[i];
  }
  if (w.norm_topk_prob && w.top_k > 1) {
    for (int i = 0; i < w.top_k; ++i) weights[i] /= (sum + 1e-20f);
  }
  for (int i = 0; i < w.top_k; ++i) weights[i] *= w.routed_scaling_factor;
}

}  // namespace cpu

namespace {

// down(silu(gate(x)) * up(x)) for rows of x, gathered from a step of step_rows rows (a routed
// expert's where routed_expert).
void run_mlp(CpuBackend& be, const Tensor& x, const LinearWeight& gate_up, const LinearWeight& down, Tensor& out,
             int64_t step_rows, bool routed_expert) {
  const int64_t rows = x.dim(0);
  Tensor gu = be.empty({rows, gate_up.out_features}, DType::kF32);
  be.linear_in_step(x, gate_up, gu, step_rows, routed_expert);
  Tensor act = be.empty({rows, gate_up.out_features / 2}, DType::kF32);
  be.silu_mul(gu, act);
  be.linear_in_step(act, down, out, step_rows, routed_expert);
}

}  // namespace

void CpuBackend::moe(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing) {
  const int64_t num_tokens = x.dim(0), hidden = x.dim(1);
  const int top_k = w.top_k;
  Tensor logits = empty({num_tokens, w.num_experts}, DType::kF32);
  cpu::matmul_xwt(x.as<float>(), num_tokens, hidden, w.gate.as<float>(), w.num_experts, logits.as<float>());

  std::vector<int32_t> ids(num_tokens * top_k);
  std::vector<float> weights(num_tokens * top_k);
  for (int64_t t = 0; t < num_tokens; ++t)
    cpu::route_token(logits.as<float>() + t * w.num_experts, w, ids.data() + t * top_k, weights.data() + t * top_k);

  // Rows per expert, then one MLP call per expert over its rows.
  std::vector<std::vector<int32_t>> rows_of(w.num_experts);  // entries t * top_k + slot
  for (int64_t i = 0; i < num_tokens * top_k; ++i) rows_of[ids[i]].push_back(static_cast<int32_t>(i));
  std::vector<float> expert_out(num_tokens * top_k * hidden);
  for (int e = 0; e < w.num_experts; ++e) {
    const auto& entries = rows_of[e];
    if (entries.empty()) continue;
    const int64_t n = entries.size();
    Tensor xe = empty({n, hidden}, DType::kF32);
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(x.as<float>() + (entries[r] / top_k) * hidden, hidden, xe.as<float>() + r * hidden);
    Tensor ye = empty({n, hidden}, DType::kF32);
    run_mlp(*this, xe, w.expert_gate_up[e], w.expert_down[e], ye, num_tokens, /*routed_expert=*/true);
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(ye.as<float>() + r * hidden, hidden, expert_out.data() + static_cast<int64_t>(entries[r]) * hidden);
  }
  float* o = out.as<float>();
  std::fill(o, o + num_tokens * hidden, 0.0f);
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int k = 0; k < top_k; ++k) {
      const float wk = weights[t * top_k + k];
      const float* y = expert_out.data() + (t * top_k + k) * hidden;
      for (int64_t i = 0; i < hidden; ++i) o[t * hidden + i] += wk * y[i];
    }
  if (w.has_shared) {
    Tensor shared = empty({num_tokens, hidden}, DType::kF32);
    run_mlp(*this, x, w.shared_gate_up, w.shared_down, shared, num_tokens, /*routed_expert=*/false);
    add(out, shared);
  }
  if (routing != nullptr) {
    routing->expert_ids = std::move(ids);
    routing->weights = std::move(weights);
  }
}

}  // namespace dsinfer
