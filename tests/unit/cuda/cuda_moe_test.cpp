// MoE of the CUDA backend against the CPU backend for every gate variant: the same experts
// chosen with the same weights, and the combined output within bf16 tolerance.
#include <gtest/gtest.h>

#include <set>

#include "cuda_test_util.h"

namespace dsinfer {
namespace {

using testing_cuda::CudaVsCpuTest;
using testing_cuda::download;
using testing_cuda::random_values;
using testing_cuda::relative_error;
using testing_cuda::upload;

struct GateSpec {
  int num_experts, top_k, num_groups, topk_groups;
  GateScoring scoring;
  GateTopk method;
  bool norm_topk_prob;
  float scaling;
  bool shared;
};

class CudaMoeTest : public CudaVsCpuTest {
 protected:
  MoeWeights build(Backend& be, const GateSpec& g, int64_t hidden, int64_t inter, uint32_t seed) {
    MoeWeights w;
    w.num_experts = g.num_experts;
    w.top_k = g.top_k;
    w.num_groups = g.num_groups;
    w.topk_groups = g.topk_groups;
    w.scoring = g.scoring;
    w.topk_method = g.method;
    w.norm_topk_prob = g.norm_topk_prob;
    w.routed_scaling_factor = g.scaling;
    w.gate = upload(be, {g.num_experts, hidden}, random_values(g.num_experts * hidden, seed, 0.3f));
    if (g.method == GateTopk::kNoauxTc) {
      auto bias = random_values(g.num_experts, seed + 1, 0.05f);
      w.score_correction_bias = upload(be, {g.num_experts}, bias);
    }
    const float s_in = 1.0f / std::sqrt(static_cast<float>(hidden)), s_mid = 1.0f / std::sqrt(static_cast<float>(inter));
    for (int e = 0; e < g.num_experts; ++e) {
      auto gu = random_values(2 * inter * hidden, seed + 10 + 2 * e, s_in);
      auto down = random_values(hidden * inter, seed + 11 + 2 * e, s_mid);
      w.expert_gate_up.push_back(be.make_linear(HostTensor{DType::kF32, {2 * inter, hidden}, gu.data()}));
      w.expert_down.push_back(be.make_linear(HostTensor{DType::kF32, {hidden, inter}, down.data()}));
    }
    w.has_shared = g.shared;
    if (g.shared) {
      auto gu = random_values(4 * inter * hidden, seed + 5, s_in);
      auto down = random_values(hidden * 2 * inter, seed + 6, s_mid);
      w.shared_gate_up = be.make_linear(HostTensor{DType::kF32, {4 * inter, hidden}, gu.data()});
      w.shared_down = be.make_linear(HostTensor{DType::kF32, {hidden, 2 * inter}, down.data()});
    }
    return w;
  }

  void run_case(const GateSpec& g, int64_t num_tokens, uint32_t seed) {
    const int64_t hidden = 256, inter = 96;
    const auto x = random_values(num_tokens * hidden, seed + 1000);
    Backend* bes[2] = {cpu_.get(), gpu_.get()};
    std::vector<float> out[2];
    MoeRouting routing[2];
    for (int b = 0; b < 2; ++b) {
      MoeWeights w = build(*bes[b], g, hidden, inter, seed);
      Tensor tx = upload(*bes[b], {num_tokens, hidden}, x), tout = bes[b]->empty({num_tokens, hidden}, DType::kF32);
      bes[b]->moe(tx, w, tout, &routing[b]);
      out[b] = download(*bes[b], tout);
    }
    ASSERT_EQ(routing[1].expert_ids.size(), static_cast<size_t>(num_tokens * g.top_k));
    EXPECT_EQ(routing[1].expert_ids, routing[0].expert_ids);
    for (size_t i = 0; i < routing[0].weights.size(); ++i)
      EXPECT_NEAR(routing[1].weights[i], routing[0].weights[i], 1e-4 * std::max(1.0f, std::abs(routing[0].weights[i])));
    // Group limits: no chosen expert outside the kept groups (checked on the CUDA side).
    if (g.method != GateTopk::kGreedy && g.num_groups > 1) {
      const int per_group = g.num_experts / g.num_groups;
      for (int64_t t = 0; t < num_tokens; ++t) {
        std::set<int> groups;
        for (int k = 0; k < g.top_k; ++k) groups.insert(routing[1].expert_ids[t * g.top_k + k] / per_group);
        EXPECT_LE(static_cast<int>(groups.size()), g.topk_groups);
      }
    }
    EXPECT_LT(relative_error(out[1], out[0]), 2e-2);
  }
};

TEST_F(CudaMoeTest, GreedySoftmaxV2Style) {
  const GateSpec g{64, 6, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, false, 1.0f, true};
  run_case(g, 1, 1);
  run_case(g, 37, 2);
}

TEST_F(CudaMoeTest, GroupLimitedGreedySoftmax) {
  const GateSpec g{16, 4, 4, 2, GateScoring::kSoftmax, GateTopk::kGroupLimitedGreedy, true, 16.0f, false};
  run_case(g, 3, 3);
  run_case(g, 50, 4);
}

TEST_F(CudaMoeTest, NoauxTcSigmoidWithCorrectionBias) {
  const GateSpec g{32, 4, 8, 3, GateScoring::kSigmoid, GateTopk::kNoauxTc, true, 2.5f, true};
  run_case(g, 1, 5);
  run_case(g, 129, 6);
  const GateSpec unnormalised{24, 3, 4, 2, GateScoring::kSigmoid, GateTopk::kNoauxTc, false, 1.5f, false};
  run_case(unnormalised, 20, 7);
}

}  // namespace
}  // namespace dsinfer
