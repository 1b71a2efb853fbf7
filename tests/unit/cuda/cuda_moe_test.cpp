// MoE of the CUDA backend against the CPU backend for every gate variant: the same experts
// chosen with the same weights, and the combined output within bf16 tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "forward_batch_util.h"

namespace dsinfer {
namespace {

using testing_cuda::bf16_values;
using testing_cuda::CudaVsCpuOneTermTest;
using testing_cuda::download;
using testing_cuda::make_backend_with_env;
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
  int favoured_experts = 0;  // noaux_tc: experts 0 .. n-1 get a correction bias every token picks
  int tied_experts = 0;      // experts 0 .. n-1 share one gate row: equal scores, picked by index
};

// The e4m3 codes of the experts' weights: random values, every finite code in turn, or only the
// subnormal codes and the smallest normal ones (a kernel that flushed subnormals would lose them).
enum class Fp8Codes { kRandom, kEveryCode, kSubnormal };

// e4m3 experts in DeepSeek's FP8 activations wherever their forms take them: steps of up to 256
// rows keep the recipe's single term rather than three e4m3 terms
// (PromptStepsTakeE4m3TermsIntoExperts checks the default).
class CudaMoeTest : public CudaVsCpuOneTermTest {
 protected:
  // The layer's output on `be` for x [num_tokens, hidden], inside `step` where one is given.
  std::vector<float> moe_output(Backend& be, const GateSpec& g, const std::vector<float>& x, int64_t num_tokens,
                                int64_t hidden, int64_t inter, uint32_t seed, const ForwardBatch* step = nullptr) {
    MoeWeights w = build(be, g, hidden, inter, seed, /*fp8=*/true);
    Tensor tx = upload(be, {num_tokens, hidden}, x), tout = be.empty({num_tokens, hidden}, DType::kF32);
    if (step != nullptr) be.begin_step(*step);
    be.moe(tx, w, tout, nullptr);
    if (step != nullptr) be.end_step();
    return download(be, tout);
  }

  // An e4m3 weight [rows, cols] with 128x128 block scales that vary across blocks; a routed
  // expert's where routed_expert, as the model's loader marks them.
  LinearWeight fp8_weight(Backend& be, int64_t rows, int64_t cols, uint32_t seed, bool gate_up,
                          std::vector<std::vector<uint8_t>>& keep_bytes, std::vector<std::vector<float>>& keep_scales,
                          bool routed_expert = false) {
    const int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
    auto& scales = keep_scales.emplace_back(rb * cb);
    for (int64_t i = 0; i < rb * cb; ++i) scales[i] = 0.002f * (1 + (seed + i) % 5);
    const auto v = random_values(rows * cols, seed, 100.0f);
    auto& bytes = keep_bytes.emplace_back(rows * cols);
    std::vector<uint8_t> codes;
    for (int c = 0; c < 256; ++c) {
      const bool nan = (c & 0x7f) == 0x7f, small = (c & 0x7f) <= 0x0a;
      if (!nan && (fp8_codes_ == Fp8Codes::kEveryCode || small)) codes.push_back(static_cast<uint8_t>(c));
    }
    for (int64_t i = 0; i < rows * cols; ++i) {
      // A walk through the codes that differs between rows and weights.
      const size_t step = static_cast<size_t>(i) * 7 + static_cast<size_t>(i / cols) * 3 + seed;
      bytes[i] = fp8_codes_ == Fp8Codes::kRandom ? f32_to_fp8e4m3(v[i]) : codes[step % codes.size()];
    }
    HostTensor h{DType::kF8E4M3, {rows, cols}, bytes.data(), scales.data(), 128, 128};
    h.routed_expert = routed_expert;
    return gate_up ? be.make_gate_up(h) : be.make_linear(h);
  }

  Fp8Codes fp8_codes_ = Fp8Codes::kRandom;
  std::vector<int32_t> last_expert_ids_;  // the CUDA side's picks of the last run_case

  MoeWeights build(Backend& be, const GateSpec& g, int64_t hidden, int64_t inter, uint32_t seed, bool fp8 = false) {
    MoeWeights w;
    w.num_experts = g.num_experts;
    w.top_k = g.top_k;
    w.num_groups = g.num_groups;
    w.topk_groups = g.topk_groups;
    w.scoring = g.scoring;
    w.topk_method = g.method;
    w.norm_topk_prob = g.norm_topk_prob;
    w.routed_scaling_factor = g.scaling;
    auto gate = random_values(g.num_experts * hidden, seed, 0.3f);
    for (int e = 1; e < g.tied_experts; ++e) std::copy_n(gate.begin(), hidden, gate.begin() + e * hidden);
    w.gate = upload(be, {g.num_experts, hidden}, gate);
    if (g.method == GateTopk::kNoauxTc) {
      auto bias = random_values(g.num_experts, seed + 1, 0.05f);
      for (int e = 0; e < g.favoured_experts; ++e) bias[e] += 10.0f;
      w.score_correction_bias = upload(be, {g.num_experts}, bias);
    }
    const float s_in = 1.0f / std::sqrt(static_cast<float>(hidden)), s_mid = 1.0f / std::sqrt(static_cast<float>(inter));
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<std::vector<float>> scales;
    for (int e = 0; e < g.num_experts; ++e) {
      if (fp8) {
        w.expert_gate_up.push_back(fp8_weight(be, 2 * inter, hidden, seed + 10 + 2 * e, true, bytes, scales, true));
        w.expert_down.push_back(fp8_weight(be, hidden, inter, seed + 11 + 2 * e, false, bytes, scales, true));
        continue;
      }
      auto gu = bf16_values(random_values(2 * inter * hidden, seed + 10 + 2 * e, s_in));
      auto down = bf16_values(random_values(hidden * inter, seed + 11 + 2 * e, s_mid));
      // Routed experts' weights, as the model's loader marks them (the CUDA backend's one term).
      HostTensor gu_h{DType::kF32, {2 * inter, hidden}, gu.data()}, down_h{DType::kF32, {hidden, inter}, down.data()};
      gu_h.routed_expert = down_h.routed_expert = true;
      w.expert_gate_up.push_back(be.make_gate_up(gu_h));
      w.expert_down.push_back(be.make_linear(down_h));
    }
    w.has_shared = g.shared;
    if (g.shared && fp8) {
      w.shared_gate_up = fp8_weight(be, 4 * inter, hidden, seed + 5, true, bytes, scales);
      w.shared_down = fp8_weight(be, hidden, 2 * inter, seed + 6, false, bytes, scales);
    } else if (g.shared) {
      auto gu = bf16_values(random_values(4 * inter * hidden, seed + 5, s_in));
      auto down = bf16_values(random_values(hidden * 2 * inter, seed + 6, s_mid));
      w.shared_gate_up = be.make_gate_up(HostTensor{DType::kF32, {4 * inter, hidden}, gu.data()});
      w.shared_down = be.make_linear(HostTensor{DType::kF32, {hidden, 2 * inter}, down.data()});
    }
    be.prepare(w);
    return w;
  }

  void run_case(const GateSpec& g, int64_t num_tokens, uint32_t seed, int64_t hidden = 256, int64_t inter = 96,
                bool fp8 = false, double tolerance = 2e-2) {
    const auto x = random_values(num_tokens * hidden, seed + 1000);
    Backend* bes[2] = {cpu_.get(), gpu_.get()};
    std::vector<float> out[2];
    MoeRouting routing[2];
    for (int b = 0; b < 2; ++b) {
      MoeWeights w = build(*bes[b], g, hidden, inter, seed, fp8);
      Tensor tx = upload(*bes[b], {num_tokens, hidden}, x), tout = bes[b]->empty({num_tokens, hidden}, DType::kF32);
      bes[b]->moe(tx, w, tout, &routing[b]);
      out[b] = download(*bes[b], tout);
    }
    ASSERT_EQ(routing[1].expert_ids.size(), static_cast<size_t>(num_tokens * g.top_k));
    EXPECT_EQ(routing[1].expert_ids, routing[0].expert_ids);
    last_expert_ids_ = routing[1].expert_ids;
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
    EXPECT_LT(relative_error(out[1], out[0]), tolerance);
  }
};

TEST_F(CudaMoeTest, GreedySoftmaxV2Style) {
  const GateSpec g{64, 6, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, false, 1.0f, true};
  run_case(g, 1, 1);
  run_case(g, 37, 2);
}

TEST_F(CudaMoeTest, FewTokensShareExpertsInTheFewRowKernel) {
  // Steps of up to four tokens may take the few-row kernel for the routed and shared experts
  // (up to two by default; four here); with 4 experts and top-2, experts get up to four rows
  // each.
  gpu_ = make_backend_with_env("cuda", "DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS", "4");
  const GateSpec g{4, 2, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true};
  for (int64_t num_tokens : {2, 3, 4}) run_case(g, num_tokens, 80 + static_cast<uint32_t>(num_tokens));
  // e4m3 experts: on tensor cores from two tokens and CUDA cores at one (the default), on tensor
  // cores at one token too (DSINFER_FEW_ROW_MMA=experts) and on CUDA cores at every count
  // (DSINFER_FEW_ROW_MMA=0), grouped gate/up and down products of one to four rows an expert.
  for (int64_t num_tokens : {1, 3, 4}) run_case(g, num_tokens, 90 + static_cast<uint32_t>(num_tokens), 256, 128, true);
  for (const char* mma : {"experts", "0"}) {
    setenv("DSINFER_FEW_ROW_MMA", mma, 1);
    gpu_ = make_backend_with_env("cuda", "DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS", "4");
    unsetenv("DSINFER_FEW_ROW_MMA");
    for (int64_t num_tokens : {1, 4}) run_case(g, num_tokens, 90, 256, 128, /*fp8=*/true);
  }
}

TEST_F(CudaMoeTest, FewRowFixedPhasesMatchTheRunTimeWalk) {
  // Steps of one and two tokens: the few-row kernel's CUDA-core blocks walk a K of up to four
  // phases with the count fixed at compile time, and the walk of phases read at run time
  // (DSINFER_FEW_ROW_FIXED_PHASES=0) must give the same bits. hidden 1,536 is 192 bf16 pieces
  // (two phases, the second partly past K) and 96 e4m3 ones (one); inter 1,408 (the routed down
  // product's K) 176 and 88; the shared down's 2,816 is 352 bf16 pieces (three, walked as four)
  // and 176 e4m3 ones (two). e4m3 experts on CUDA cores (DSINFER_FEW_ROW_MMA=0) to take the form,
  // whose fixed walks sum in f16 pairs: close to the run-time walk's fp32 sums, not the same bits.
  setenv("DSINFER_FEW_ROW_MMA", "0", 1);
  gpu_ = make_backend("cuda");
  auto run_time = make_backend_with_env("cuda", "DSINFER_FEW_ROW_FIXED_PHASES", "0");
  unsetenv("DSINFER_FEW_ROW_MMA");
  const GateSpec g{8, 2, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true};
  const int64_t hidden = 1536, inter = 1408;
  const auto x = random_values(2 * hidden, 301);
  for (bool fp8 : {false, true}) {
    Backend* bes[3] = {cpu_.get(), gpu_.get(), run_time.get()};
    std::vector<float> out[3][2];  // [backend][tokens - 1]
    for (int b = 0; b < 3; ++b) {
      MoeWeights w = build(*bes[b], g, hidden, inter, 302, fp8);
      for (int64_t tokens : {1, 2}) {
        Tensor tx = upload(*bes[b], {tokens, hidden}, {x.begin(), x.begin() + tokens * hidden});
        Tensor tout = bes[b]->empty({tokens, hidden}, DType::kF32);
        bes[b]->moe(tx, w, tout, nullptr);
        out[b][tokens - 1] = download(*bes[b], tout);
      }
    }
    for (int t = 0; t < 2; ++t) {
      // e4m3 weights' fixed walks sum each piece in f16 pairs (few_row_gemm.cuh), the run-time
      // walk in fp32; SiLU·up is rounded to bf16 between the two products, and the f16 sums move
      // some of its values across a bf16 step: a few parts in 10^3 apart at most.
      if (fp8) EXPECT_LT(relative_error(out[1][t], out[2][t]), 4e-3) << t + 1 << " tokens";
      else EXPECT_EQ(out[1][t], out[2][t]) << t + 1 << " tokens";
      EXPECT_LT(relative_error(out[1][t], out[0][t]), 2e-2) << "fp8 " << fp8 << ", " << t + 1 << " tokens";
    }
  }
}

TEST_F(CudaMoeTest, SharedExpertsInOrBesideTheRoutingGiveTheSameBits) {
  // Steps of one or two tokens run the shared experts' products in the routing's own launches;
  // with DSINFER_MOE_SHARED_IN_ROUTING=0, small steps run them on a second stream beside the
  // routing; with DSINFER_MOE_SIDE_STREAM=0, after the routed experts. The products' blocks are
  // the same few-row or tensor-core blocks either way, so all three give the same bits. Steps
  // that take each path: 1 and 2 tokens in the routing (bf16 and e4m3 weights), 32 beside,
  // 33 after (cuBLASLt's shared product).
  auto beside = make_backend_with_env("cuda", "DSINFER_MOE_SHARED_IN_ROUTING", "0");
  auto after = make_backend_with_env("cuda", "DSINFER_MOE_SIDE_STREAM", "0");
  const GateSpec g{16, 4, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true};
  const int64_t hidden = 256, inter = 96;
  for (bool fp8 : {false, true}) {
    for (int64_t num_tokens : {1, 2, 32, 33}) {
      if (fp8 && num_tokens > 2) continue;
      const auto x = random_values(num_tokens * hidden, 40 + static_cast<uint32_t>(num_tokens));
      Backend* bes[3] = {gpu_.get(), beside.get(), after.get()};
      std::vector<float> out[3];
      for (int b = 0; b < 3; ++b) {
        MoeWeights w = build(*bes[b], g, hidden, fp8 ? 128 : inter, 41, fp8);
        Tensor tx = upload(*bes[b], {num_tokens, hidden}, x), tout = bes[b]->empty({num_tokens, hidden}, DType::kF32);
        // Twice on the same backend: blocks held while the streams run side by side go back to
        // the cache, and the second step's buffers come from it.
        for (int rep = 0; rep < 2; ++rep) bes[b]->moe(tx, w, tout, nullptr);
        out[b] = download(*bes[b], tout);
      }
      EXPECT_EQ(out[0], out[1]) << num_tokens << " tokens, fp8 " << fp8;
      EXPECT_EQ(out[0], out[2]) << num_tokens << " tokens, fp8 " << fp8;
      EXPECT_GT(*std::max_element(out[0].begin(), out[0].end()), 0.0f);
    }
  }
}

TEST_F(CudaMoeTest, SharedExpertsOnTensorCoresInOrBesideTheRoutingGiveTheSameBits) {
  // With DSINFER_FEW_ROW_MMA=all the shared experts' e4m3 products take the few-row kernel's
  // tensor-core form too, in the routing's launches or (DSINFER_MOE_SHARED_IN_ROUTING=0) alone
  // beside them: the same bits, and the CPU's result. At two tokens the shared down product's x
  // rows (2 × 6,144 f16) and the routing's own shared memory pass the 48 KB a launch gets by
  // default.
  setenv("DSINFER_FEW_ROW_MMA", "all", 1);
  gpu_ = make_backend("cuda");
  auto beside = make_backend_with_env("cuda", "DSINFER_MOE_SHARED_IN_ROUTING", "0");
  unsetenv("DSINFER_FEW_ROW_MMA");
  const GateSpec g{16, 4, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true};
  const int64_t hidden = 256, inter = 3072;
  for (int64_t num_tokens : {1, 2}) {
    const auto x = random_values(num_tokens * hidden, 140 + static_cast<uint32_t>(num_tokens));
    Backend* bes[3] = {cpu_.get(), gpu_.get(), beside.get()};
    std::vector<float> out[3];
    for (int b = 0; b < 3; ++b) {
      MoeWeights w = build(*bes[b], g, hidden, inter, 141, /*fp8=*/true);
      Tensor tx = upload(*bes[b], {num_tokens, hidden}, x), tout = bes[b]->empty({num_tokens, hidden}, DType::kF32);
      bes[b]->moe(tx, w, tout, nullptr);
      out[b] = download(*bes[b], tout);
    }
    EXPECT_EQ(out[1], out[2]) << num_tokens << " tokens";
    EXPECT_LT(relative_error(out[1], out[0]), 2e-2) << num_tokens << " tokens";
  }
}

TEST_F(CudaMoeTest, LibrarySharedExpertsBesideTheRoutedOnesGiveTheSameBits) {
  // Steps of up to 128 tokens whose shared products take cuBLASLt run them on the side stream,
  // with its own cuBLASLt handle, beside the routing and the routed experts; larger ones after
  // the routed experts (DSINFER_MOE_SHARED_BESIDE_LIBRARY=0: always after, =1: always beside).
  // All three give the same bits, and the CPU's result. bf16 and e4m3 experts, mid- and
  // prefill-sized steps; the e4m3 layers' x comes from a norm that writes its rows in e4m3 too,
  // which the side stream's gate/up product reads where the main stream made them before the fork.
  auto after = make_backend_with_env("cuda", "DSINFER_MOE_SHARED_BESIDE_LIBRARY", "0");
  auto beside = make_backend_with_env("cuda", "DSINFER_MOE_SHARED_BESIDE_LIBRARY", "1");
  const GateSpec g{16, 4, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true};
  struct Case {
    int64_t num_tokens, hidden, inter;
    bool fp8;
  };
  for (const Case& c : {Case{1100, 128, 64, false}, Case{40, 256, 96, false}, Case{301, 256, 128, true},
                        Case{1100, 256, 128, true}, Case{48, 256, 128, true}}) {
    SCOPED_TRACE(::testing::Message() << c.num_tokens << " tokens, fp8 " << c.fp8);
    const auto x = random_values(c.num_tokens * c.hidden, 150 + static_cast<uint32_t>(c.num_tokens));
    const auto residual = random_values(c.num_tokens * c.hidden, 151, 3.0f);
    const auto norm_w = random_values(c.hidden, 152, 1.0f);
    Backend* bes[4] = {cpu_.get(), gpu_.get(), after.get(), beside.get()};
    std::vector<float> out[4];
    MoeRouting routing[4];
    for (int b = 0; b < 4; ++b) {
      MoeWeights w = build(*bes[b], g, c.hidden, c.inter, 153, c.fp8);
      Tensor tres = upload(*bes[b], {c.num_tokens, c.hidden}, residual);
      Tensor tx = upload(*bes[b], {c.num_tokens, c.hidden}, x), tw = upload(*bes[b], {c.hidden}, norm_w);
      Tensor normed = bes[b]->empty({c.num_tokens, c.hidden}, DType::kF32);
      Tensor tout = bes[b]->empty({c.num_tokens, c.hidden}, DType::kF32);
      bes[b]->add_rms_norm(tres, tx, tw, 1e-6f, normed);
      bes[b]->moe(normed, w, tout, &routing[b]);
      out[b] = download(*bes[b], tout);
    }
    for (int b = 2; b < 4; ++b) {
      SCOPED_TRACE(b);
      EXPECT_EQ(routing[b].expert_ids, routing[1].expert_ids);
      EXPECT_EQ(out[b], out[1]);
    }
    EXPECT_LT(relative_error(out[1], out[0]), c.fp8 ? 8e-2 : 2e-2);
  }
}

TEST_F(CudaMoeTest, CombineMadeInTheNormGivesTheSameBits) {
  // moe_add_rms_norm: with DSINFER_MOE_COMBINE_IN_NORM=1 the norm makes the layer's combined rows
  // where it adds them; with =0 the combine writes them and the norm reads them back; by
  // default the first in steps of 512 tokens or more. All give the same bits: the residual, the
  // normed rows and the routing. The fused form leaves the scratch rows as they were; rows the
  // norm's register form does not hold (hidden 90) and more than eight routed entries a token
  // take the two kernels, and write them.
  // Each norm in a launch of its own, not left to the products after it (that form has its own
  // test below).
  setenv("DSINFER_NORM_IN_PRODUCTS", "0", 1);
  auto always = make_backend_with_env("cuda", "DSINFER_MOE_COMBINE_IN_NORM", "1");
  auto apart = make_backend_with_env("cuda", "DSINFER_MOE_COMBINE_IN_NORM", "0");
  auto by_default = make_backend("cuda");
  unsetenv("DSINFER_NORM_IN_PRODUCTS");
  struct Case {
    GateSpec g;
    int64_t num_tokens, hidden, inter;
    bool fp8, fusable;
  };
  const GateSpec six{64, 6, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, false, 1.0f, true};
  const GateSpec four{16, 4, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true};
  const GateSpec ten{16, 10, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, false};
  const Case cases[] = {
      {six, 1, 256, 96, false, true},    {six, 2, 256, 96, false, true},    {four, 33, 2304, 96, false, true},
      {four, 300, 256, 64, false, true}, {four, 600, 256, 64, false, true}, {four, 301, 256, 128, true, true},
      {four, 520, 256, 128, true, true}, {four, 2, 256, 128, true, true},   {four, 5, 90, 64, false, false},
      {ten, 3, 256, 64, false, false},   {ten, 512, 256, 64, false, false},
      // V2-Lite's hidden size: the norm's blocks of 512 threads.
      {six, 3, 2048, 64, false, true},   {six, 530, 2048, 128, true, true},
  };
  constexpr float kUnwritten = 7.0f;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.num_tokens << " tokens, hidden " << c.hidden << ", top-" << c.g.top_k
                                    << ", fp8 " << c.fp8);
    const auto x = random_values(c.num_tokens * c.hidden, 60 + static_cast<uint32_t>(c.num_tokens));
    const auto residual = random_values(c.num_tokens * c.hidden, 61 + static_cast<uint32_t>(c.num_tokens), 3.0f);
    const auto norm_w = random_values(c.hidden, 62, 1.0f);
    Backend* bes[3] = {apart.get(), always.get(), by_default.get()};
    std::vector<float> res_out[3], normed[3], scratch[3];
    MoeRouting routing[3];
    for (int b = 0; b < 3; ++b) {
      MoeWeights w = build(*bes[b], c.g, c.hidden, c.inter, 63, c.fp8);
      Tensor tx = upload(*bes[b], {c.num_tokens, c.hidden}, x);
      Tensor tres = upload(*bes[b], {c.num_tokens, c.hidden}, residual);
      Tensor tw = upload(*bes[b], {c.hidden}, norm_w);
      Tensor tout = upload(*bes[b], {c.num_tokens, c.hidden}, std::vector<float>(c.num_tokens * c.hidden, kUnwritten));
      // normed is x itself, as in the model: the layer reads x before the norm writes it.
      bes[b]->moe_add_rms_norm(tx, w, tout, &routing[b], tres, tw, 1e-6f, tx);
      res_out[b] = download(*bes[b], tres);
      normed[b] = download(*bes[b], tx);
      scratch[b] = download(*bes[b], tout);
    }
    EXPECT_NE(res_out[0], residual);
    const bool unwritten[3] = {false, c.fusable, c.fusable && c.num_tokens >= 512};
    for (int b = 1; b < 3; ++b) {
      SCOPED_TRACE(b);
      EXPECT_EQ(res_out[b], res_out[0]);
      EXPECT_EQ(normed[b], normed[0]);
      EXPECT_EQ(routing[b].expert_ids, routing[0].expert_ids);
      EXPECT_EQ(routing[b].weights, routing[0].weights);
      if (unwritten[b])
        EXPECT_TRUE(std::all_of(scratch[b].begin(), scratch[b].end(), [](float v) { return v == kUnwritten; }));
      else
        EXPECT_EQ(scratch[b], scratch[0]);
    }
  }
}

// moe_add_rms_norm in steps of one and two tokens: the combine adds to the residual and writes
// the next norm's output without each row's 1 / rms, which the products after it apply
// (CudaBackend::PendingNorm): here a linear and the next MoE layer (router logits, shared experts
// in the routing's launches, routed experts on the few-row kernel, both of its forms for e4m3).
// Against the CUDA form with the norm in its own launch (DSINFER_NORM_IN_PRODUCTS=0) and the CPU:
// the residual (that form's bits), both layers' routing, the products, and the norm's output read
// after a write to the residual, which must not change it. (By default only steps of one token
// leave the norm; DSINFER_NORM_IN_PRODUCTS=2 takes two as well.)
TEST_F(CudaMoeTest, NormLeftToTheNextLayerFollowsTheNormInItsOwnLaunch) {
  auto apart = make_backend_with_env("cuda", "DSINFER_NORM_IN_PRODUCTS", "0");
  gpu_ = make_backend_with_env("cuda", "DSINFER_NORM_IN_PRODUCTS", "2");
  const GateSpec six{64, 6, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, false, 1.0f, true};
  constexpr int64_t kHidden = 256, kInter = 96, kQ = 160;
  const auto q_w = bf16_values(random_values(kQ * kHidden, 71, 1.0f / std::sqrt(static_cast<float>(kHidden))));
  const auto norm_w = random_values(kHidden, 72, 0.5f, 1.0f);
  for (const bool fp8 : {false, true}) {
    for (const int64_t tokens : {int64_t{1}, int64_t{2}}) {
      SCOPED_TRACE(::testing::Message() << tokens << " tokens, fp8 " << fp8);
      const auto x = random_values(tokens * kHidden, 73 + static_cast<uint32_t>(tokens));
      const auto residual = random_values(tokens * kHidden, 75 + static_cast<uint32_t>(tokens), 3.0f);
      const auto later = random_values(tokens * kHidden, 77 + static_cast<uint32_t>(tokens));
      Backend* bes[3] = {apart.get(), gpu_.get(), cpu_.get()};
      std::vector<float> res[3], q[3], out[3], normed[3];
      MoeRouting first[3], next[3];
      for (int b = 0; b < (fp8 ? 2 : 3); ++b) {
        Backend& be = *bes[b];
        MoeWeights w = build(be, six, kHidden, kInter, 80, fp8);
        const LinearWeight wq = be.make_linear(HostTensor{DType::kF32, {kQ, kHidden}, q_w.data()});
        Tensor tx = upload(be, {tokens, kHidden}, x), tres = upload(be, {tokens, kHidden}, residual);
        Tensor tw = upload(be, {kHidden}, norm_w), tlater = upload(be, {tokens, kHidden}, later);
        Tensor tout = be.empty({tokens, kHidden}, DType::kF32), tq = be.empty({tokens, kQ}, DType::kF32);
        be.moe_add_rms_norm(tx, w, tout, &first[b], tres, tw, 1e-6f, tx);  // normed is x, as in the model
        be.linear(tx, wq, tq);
        be.moe(tx, w, tout, &next[b]);
        res[b] = download(be, tres);
        q[b] = download(be, tq);
        out[b] = download(be, tout);
        be.add(tres, tlater);
        normed[b] = download(be, tx);
      }
      EXPECT_EQ(res[1], res[0]);
      EXPECT_EQ(first[1].expert_ids, first[0].expert_ids);
      EXPECT_EQ(first[1].weights, first[0].weights);
      EXPECT_EQ(next[1].expert_ids, next[0].expert_ids);
      for (size_t i = 0; i < next[0].weights.size(); ++i) EXPECT_NEAR(next[1].weights[i], next[0].weights[i], 1e-5);
      EXPECT_LT(relative_error(q[1], q[0]), 1e-2);
      EXPECT_LT(relative_error(out[1], out[0]), 1e-2);
      EXPECT_LT(relative_error(normed[1], normed[0]), 1e-5);
      if (!fp8) {
        EXPECT_EQ(next[1].expert_ids, next[2].expert_ids);
        EXPECT_LT(relative_error(res[1], res[2]), 1e-2);
        EXPECT_LT(relative_error(q[1], q[2]), 2e-2);
        EXPECT_LT(relative_error(out[1], out[2]), 3e-2);
        EXPECT_LT(relative_error(normed[1], normed[2]), 1e-2);
      }
    }
  }
}

TEST_F(CudaMoeTest, PaddedShapesAndManyRowsPerExpert) {
  // hidden 80 and inter 24 are not whole GEMM tiles; 300 tokens over 8 experts give several
  // row blocks per expert, and the shared expert's 300 rows take the cuBLASLt path.
  const GateSpec g{8, 2, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true};
  run_case(g, 300, 11, 80, 24);
  run_case(g, 5, 12, 80, 24);
}

TEST_F(CudaMoeTest, Fp8ExpertsMatchDequantisedCpu) {
  const GateSpec g{8, 2, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, false};
  // Three tokens, one row per expert on average, past the few-row kernel's two: the 128-row
  // expert blocks with e4m3 activations, and with DSINFER_MOE_FP8_EXPERT_BLOCK_MIN_ROWS=4 the
  // 32-row blocks on bf16 activations (closer to the CPU's bf16 rows). The expert blocks'
  // result must stay within the e4m3 activations' rounding of the 32-row blocks'.
  run_case(g, 3, 13, 256, 128, /*fp8=*/true, /*tolerance=*/8e-2);
  const auto x = random_values(3 * 256, 1013);
  std::vector<float> out[2];
  auto row_blocks = make_backend_with_env("cuda", "DSINFER_MOE_FP8_EXPERT_BLOCK_MIN_ROWS", "4");
  Backend* bes[2] = {gpu_.get(), row_blocks.get()};
  for (int b = 0; b < 2; ++b) {
    MoeWeights w = build(*bes[b], g, 256, 128, 13, /*fp8=*/true);
    Tensor tx = upload(*bes[b], {3, 256}, x), tout = bes[b]->empty({3, 256}, DType::kF32);
    bes[b]->moe(tx, w, tout, nullptr);
    out[b] = download(*bes[b], tout);
  }
  EXPECT_NE(out[0], out[1]) << "the two block kinds round activations differently";
  EXPECT_LT(relative_error(out[0], out[1]), 8e-2);
  gpu_ = std::move(row_blocks);
  run_case(g, 3, 13, 256, 128, /*fp8=*/true);
  gpu_ = make_backend("cuda");
  // About 22 rows per expert: the 128-row expert blocks with e4m3 activations (checked against
  // their own reference in cuda_fp8_gemm_test.cpp).
  run_case(g, 90, 14, 256, 128, /*fp8=*/true, /*tolerance=*/8e-2);
  // Prefill-sized: every expert's rows through cuBLASLt's block-scaled product, whose output
  // rows come in groups of 4 (301 tokens: experts end at odd rows of the shared buffer). Its
  // activations are e4m3 too (3 mantissa bits, about 3% RMS rounding per product), so the
  // bound is wider; rows mixed up between experts would be off by 100%.
  run_case(g, 301, 15, 256, 128, /*fp8=*/true, /*tolerance=*/8e-2);
  // With shared experts, whose gate/up takes cuBLASLt at 301 tokens: from the copy with its
  // halves one after the other and 128 × 128 block scales (shared inter 256; block scales that
  // landed on the wrong rows would be off by up to 5 times), and, where a half does not start on
  // a source block (shared inter 192), from the interleaved weight with a scale per row.
  const GateSpec shared{8, 2, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true};
  run_case(shared, 301, 16, 256, 128, /*fp8=*/true, /*tolerance=*/8e-2);
  run_case(shared, 301, 17, 256, 96, /*fp8=*/true, /*tolerance=*/8e-2);
  gpu_ = make_backend_with_env("cuda", "DSINFER_GATE_UP_HALVES", "0");
  run_case(shared, 301, 16, 256, 128, /*fp8=*/true, /*tolerance=*/8e-2);
}

// The default backend's e4m3 experts take FP8 activations in three e4m3 terms in the steps whose
// dense products take them (a prompt's steps of up to 256 rows; the wgmma expert blocks add the
// terms' products, the weight read once): within 3·10^-3 of bf16 rows (DSINFER_MOE_FP8_ACTIVATIONS=0,
// 1.0·10^-3 measured) where DeepSeek's single term is off by percents, and two terms
// (DSINFER_FP8_ACTIVATION_TERMS=2) in between; an x row of the wrong term or pass would be off
// by its whole size. 40 tokens over 8 experts: about 10 rows each; 90 tokens: about 22 rows
// each, some experts past one 32-row pass. A decode-only step (one new token for each sequence)
// and a step of 301 rows keep the single term, and DSINFER_FP8_ACTIVATION_TERMS=1 keeps it
// everywhere.
TEST_F(CudaMoeTest, PromptStepsTakeE4m3TermsIntoExperts) {
  const GateSpec g{8, 2, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, false};
  const int64_t hidden = 256, inter = 128;
  auto one_term = std::move(gpu_);
  auto bf16_rows = make_backend_with_env("cuda", "DSINFER_MOE_FP8_ACTIVATIONS", "0");
  auto two_terms = make_backend_with_env("cuda", "DSINFER_FP8_ACTIVATION_TERMS", "2");
  auto default_backend = make_backend("cuda");
  for (const int64_t num_tokens : {int64_t{40}, int64_t{90}, int64_t{301}}) {
    SCOPED_TRACE(num_tokens);
    const auto x = random_values(num_tokens * hidden, 51);
    const ForwardBatch prompt = testing::single_sequence_batch(std::vector<TokenId>(num_tokens, 1), 0,
                                                               static_cast<int>((num_tokens + 63) / 64));
    const auto single = moe_output(*one_term, g, x, num_tokens, hidden, inter, 52, &prompt);
    const auto got = moe_output(*default_backend, g, x, num_tokens, hidden, inter, 52, &prompt);
    if (num_tokens <= 256) {
      const auto want = moe_output(*bf16_rows, g, x, num_tokens, hidden, inter, 52, &prompt);
      const auto two = moe_output(*two_terms, g, x, num_tokens, hidden, inter, 52, &prompt);
      EXPECT_LT(relative_error(got, want), 3e-3);
      EXPECT_GT(relative_error(single, want), 1e-2);
      EXPECT_LT(relative_error(two, want), 0.5 * relative_error(single, want));
      EXPECT_GT(relative_error(two, want), relative_error(got, want));
      ForwardBatch decode;
      for (int seq = 0; seq < num_tokens; ++seq) testing::append_sequence(decode, {seq}, 7, 1, [](int) { return 1; });
      EXPECT_EQ(moe_output(*default_backend, g, x, num_tokens, hidden, inter, 52, &decode),
                moe_output(*one_term, g, x, num_tokens, hidden, inter, 52, &decode));
    } else {
      EXPECT_EQ(got, single);
    }
  }
}

TEST_F(CudaMoeTest, Fp8ExpertsInBothBlockKindsMatchDequantisedCpu) {
  // Decode-sized layers with several rows per expert: e4m3 experts in the 128-row expert blocks
  // (weights widened in registers, 128-column stages) and, with DSINFER_MOE_FP8_EXPERT_BLOCKS=0,
  // in the 32-row blocks. 90 tokens over 8 experts (about 22 rows each) and 40 (about 10) take
  // passes of 32 and 16 rows; hidden 80 and inter 96 leave partial stages of 96 columns; inter
  // 160 gives a gate/up of 320 rows, two and a half 128-row blocks. The code walks put every
  // finite e4m3 value, and then only subnormal and the smallest normal values, in the weights:
  // flushed subnormals or a misplaced column would be off by up to 100%.
  const GateSpec g{8, 2, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, false};
  // Both with bf16 activations (DSINFER_MOE_FP8_ACTIVATIONS=0; the expert blocks' FP8 activations
  // are checked against their own reference in cuda_fp8_gemm_test.cpp).
  setenv("DSINFER_MOE_FP8_ACTIVATIONS", "0", 1);
  for (const char* expert_blocks : {"1", "0"}) {
    SCOPED_TRACE(expert_blocks);
    gpu_ = make_backend_with_env("cuda", "DSINFER_MOE_FP8_EXPERT_BLOCKS", expert_blocks);
    for (Fp8Codes codes : {Fp8Codes::kRandom, Fp8Codes::kEveryCode, Fp8Codes::kSubnormal}) {
      SCOPED_TRACE(static_cast<int>(codes));
      fp8_codes_ = codes;
      run_case(g, 90, 41, 256, 128, /*fp8=*/true);
      run_case(g, 40, 42, 80, 96, /*fp8=*/true);
      run_case(g, 64, 43, 384, 160, /*fp8=*/true);
    }
  }
  unsetenv("DSINFER_MOE_FP8_ACTIVATIONS");
}

TEST_F(CudaMoeTest, PrefillSizedBatchIsPlannedAcrossBlocks) {
  // 1,100 tokens x 4 slots: more entries than one planning block takes, so the grouping is
  // counted, placed and filled in slices; every expert then has hundreds of rows, its gate/up
  // product goes through cuBLASLt in bf16, and SiLU·up runs once over all experts.
  const GateSpec g{16, 4, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true};
  run_case(g, 1100, 21, 128, 64);
  // hidden 90, not a multiple of 4: the combine and the bf16 conversion take their scalar paths.
  run_case(g, 1100, 22, 90, 64);
}

TEST_F(CudaMoeTest, PrefillSizedExpertsOnEveryPath) {
  // The prefill-sized layers of PrefillSizedBatchIsPlannedAcrossBlocks on each path
  // (DSINFER_MOE_PREFILL_EXPERTS): bf16 experts in chunks of pointer-array products ("chunked",
  // and by default), a cuBLASLt product per expert with the row counts on the host, and the own
  // grouped kernel; e4m3 experts widened in chunks, on the host-planned path, or in the prefill
  // expert blocks ("grouped", and by default). Also a layer whose experts' rows fill few chunks
  // beside many empty ones (64 experts, 40 rows each on average).
  const GateSpec g{16, 4, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true};
  const GateSpec wide{64, 6, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, false, 1.0f, true};
  for (const char* path : {"auto", "chunked", "host", "grouped"}) {
    SCOPED_TRACE(path);
    gpu_ = make_backend_with_env("cuda", "DSINFER_MOE_PREFILL_EXPERTS", path);
    run_case(g, 1100, 23, 128, 64);
    run_case(g, 1100, 24, 90, 64);
    run_case(wide, 430, 26, 256, 96);
    run_case(g, 301, 25, 256, 128, /*fp8=*/true, /*tolerance=*/8e-2);
  }
}

TEST_F(CudaMoeTest, SkewedRoutingRunsExpertsOverManyRowBlocks) {
  // Every token picks experts 0-3 (and no other: top-4), so those take all 100 rows while the
  // batch averages 6 rows per expert: the decode kernel runs them as row-blocks of 64 and 36
  // rows in passes of 32, and the other experts' blocks find no rows. inter 96 gives a gate/up
  // of 192 rows, one and a half 128-row blocks; hidden 80 a down of 96 rows.
  const GateSpec g{64, 4, 1, 1, GateScoring::kSigmoid, GateTopk::kNoauxTc, true, 1.0f, false, 4};
  run_case(g, 100, 31, 80, 96);
  run_case(g, 100, 32, 256, 128, /*fp8=*/true, /*tolerance=*/8e-2);  // e4m3 activations
}

// The fp32 precision mode: weights widened to fp32 (e4m3 ones by their block scales) and every
// product in fp32, so the layer follows the CPU's fp32 layer to the order of its sums, about
// 1e-6 of the output's scale where the default's bf16 activations leave about 1e-3. Decode- and
// prefill-sized steps, shapes that are not whole tiles (hidden 80, inter 24), an expert over
// two row-blocks (100 rows to each of four experts), e4m3 experts, and a step of 2,200 tokens
// whose products have enough tiles to sum k's chunks within each block (gemm_f32.h).
TEST_F(CudaMoeTest, Fp32PrecisionModeMatchesCpuToFp32Rounding) {
  gpu_ = make_backend_with_env("cuda", "DSINFER_CUDA_PRECISION", "fp32");
  const GateSpec g{8, 2, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true};
  run_case(g, 1, 41, 80, 24, /*fp8=*/false, /*tolerance=*/1e-5);
  run_case(g, 300, 42, 80, 24, /*fp8=*/false, /*tolerance=*/1e-5);
  run_case(g, 2200, 45, 256, 128, /*fp8=*/false, /*tolerance=*/1e-5);
  run_case(g, 90, 43, 256, 128, /*fp8=*/true, /*tolerance=*/1e-5);
  const GateSpec skewed{64, 4, 1, 1, GateScoring::kSigmoid, GateTopk::kNoauxTc, true, 1.0f, true, 4};
  run_case(skewed, 100, 44, 80, 96, /*fp8=*/false, /*tolerance=*/1e-5);
}

// Steps of up to four tokens route and plan in one block (a warp per token, then the block's
// counts and offsets), with or without the shared experts in the same launch.
TEST_F(CudaMoeTest, DecodeSizedStepsPickTheReferenceExperts) {
  const GateSpec v2_lite{64, 6, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, false, 1.0f, true};
  const GateSpec v3{256, 8, 8, 4, GateScoring::kSigmoid, GateTopk::kNoauxTc, true, 2.5f, false};
  // Experts sharing one gate row have equal scores, and equal scores go by index: every expert
  // (the picks are 0 .. 5 in every token), or a third of them.
  const GateSpec tied{64, 6, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, false, 0, 64};
  const GateSpec tied_v3{256, 8, 8, 4, GateScoring::kSigmoid, GateTopk::kNoauxTc, true, 2.5f, true, 0, 80};
  // Nine picks a token: four tokens make 36 entries, more than a warp has lanes.
  const GateSpec wide{40, 9, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true};
  for (int64_t tokens = 1; tokens <= 4; ++tokens) {
    SCOPED_TRACE(tokens);
    run_case(v2_lite, tokens, 60 + tokens);
    run_case(v3, tokens, 70 + tokens);
    run_case(tied, tokens, 80 + tokens);
    for (int64_t i = 0; i < tokens * tied.top_k; ++i) EXPECT_EQ(last_expert_ids_[i], i % tied.top_k) << "entry " << i;
    run_case(tied_v3, tokens, 90 + tokens);
    run_case(wide, tokens, 100 + tokens);
  }
}

// A token's experts and weights have the same bits in a step of its own (the one-block routing
// and plan) as in a prefill-sized step (a launch of a warp per token, then the planning kernel).
TEST_F(CudaMoeTest, ATokensRoutingHasTheSameBitsAloneAndInAManyTokenStep) {
  const GateSpec v2_lite{64, 6, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, false, 1.0f, true};
  const GateSpec v3{256, 8, 8, 4, GateScoring::kSigmoid, GateTopk::kNoauxTc, true, 2.5f, false};
  const int64_t hidden = 256, inter = 96, num_tokens = 40;
  for (const GateSpec& g : {v2_lite, v3}) {
    MoeWeights w = build(*gpu_, g, hidden, inter, 51);
    const auto x = random_values(num_tokens * hidden, 52);
    Tensor tx = upload(*gpu_, {num_tokens, hidden}, x), tout = gpu_->empty({num_tokens, hidden}, DType::kF32);
    MoeRouting all;
    gpu_->moe(tx, w, tout, &all);
    for (int64_t t : {0, 17, 39}) {
      const std::vector<float> row(x.begin() + t * hidden, x.begin() + (t + 1) * hidden);
      Tensor one = upload(*gpu_, {1, hidden}, row), one_out = gpu_->empty({1, hidden}, DType::kF32);
      MoeRouting alone;
      gpu_->moe(one, w, one_out, &alone);
      const auto first = static_cast<size_t>(t * g.top_k);
      EXPECT_EQ(alone.expert_ids, std::vector<int32_t>(all.expert_ids.begin() + first,
                                                       all.expert_ids.begin() + first + g.top_k))
          << "token " << t;
      EXPECT_EQ(alone.weights, std::vector<float>(all.weights.begin() + first, all.weights.begin() + first + g.top_k))
          << "token " << t;
    }
  }
}

// A token alone in its step routes and plans in one warp where the layer has up to 64 experts
// and no group limit (route_plan_one_token): the same experts, weights and output bits as the
// block's path (DSINFER_MOE_ROUTE_ONE_WARP=0), with or without the shared experts in the
// routing's launch, for softmax and sigmoid scores, correction biases, tied scores and expert
// counts that do not fill the lanes.
TEST_F(CudaMoeTest, OneTokensRoutingInAWarpHasTheBlocksBits) {
  auto block = make_backend_with_env("cuda", "DSINFER_MOE_ROUTE_ONE_WARP", "0");
  const GateSpec specs[] = {
      {64, 6, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, false, 1.0f, true},
      {64, 6, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, false, 0, 64},
      {64, 6, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true, 0, 20},
      {40, 9, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, true, 1.0f, true},
      {12, 3, 1, 1, GateScoring::kSoftmax, GateTopk::kGreedy, false, 1.0f, true},
      {48, 8, 1, 1, GateScoring::kSigmoid, GateTopk::kNoauxTc, true, 2.5f, true, 3},
      {33, 32, 1, 1, GateScoring::kSigmoid, GateTopk::kNoauxTc, false, 1.5f, false},
  };
  const int64_t hidden = 256, inter = 96;
  int spec_index = 0;
  for (const GateSpec& g : specs) {
    SCOPED_TRACE(spec_index++);
    const auto x = random_values(hidden, 300 + spec_index);
    Backend* bes[2] = {gpu_.get(), block.get()};
    std::vector<float> out[2];
    MoeRouting routing[2];
    for (int b = 0; b < 2; ++b) {
      MoeWeights w = build(*bes[b], g, hidden, inter, 310 + spec_index);
      Tensor tx = upload(*bes[b], {1, hidden}, x), tout = bes[b]->empty({1, hidden}, DType::kF32);
      bes[b]->moe(tx, w, tout, &routing[b]);
      out[b] = download(*bes[b], tout);
    }
    ASSERT_EQ(routing[0].expert_ids.size(), static_cast<size_t>(g.top_k));
    EXPECT_EQ(routing[0].expert_ids, routing[1].expert_ids);
    EXPECT_EQ(routing[0].weights, routing[1].weights);
    EXPECT_EQ(out[0], out[1]);
    // Every expert tied: the picks go by index.
    for (int k = 0; k < g.top_k && g.tied_experts == g.num_experts; ++k) EXPECT_EQ(routing[0].expert_ids[k], k);
    for (int e = 0; e < g.favoured_experts; ++e) {
      EXPECT_NE(std::find(routing[0].expert_ids.begin(), routing[0].expert_ids.end(), e), routing[0].expert_ids.end())
          << "favoured expert " << e;
    }
  }
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
