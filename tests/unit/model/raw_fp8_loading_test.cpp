// The loader's raw-FP8 path (Backend::wants_raw_fp8): a CPU backend that asks for FP8 weights
// as stored must receive them with their block scales (gate/up pairs too, whatever their
// intermediate size), and, dequantising them itself, compute exactly what the default (widening)
// path computes.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/deepseek_model.h"

namespace dsinfer {
namespace {

class RawFp8CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu-raw-fp8"; }
  bool wants_raw_fp8() const override { return true; }
  Tensor empty(const std::vector<int64_t>& shape, DType dtype) override { return cpu_.empty(shape, dtype); }
  Tensor from_host(const HostTensor& host) override { return cpu_.from_host(host); }
  void to_host(const Tensor& t, float* dst) override { cpu_.to_host(t, dst); }
  void penalise_logits(Tensor& logits, std::span<const LogitPenalty> penalties) override {
    cpu_.penalise_logits(logits, penalties);
  }
  LinearWeight make_linear(const HostTensor& w) override {
    if (w.dtype == DType::kF8E4M3) {
      ++num_fp8_linears;
      EXPECT_NE(w.scale_inv, nullptr);
      EXPECT_EQ(w.block_rows, 128);
      EXPECT_EQ(w.block_cols, 128);
    }
    return cpu_.make_linear(w);
  }
  // gate and up stacked as stored, in scale blocks that span no two halves (an intermediate size
  // of 320 or 96 under 128-row blocks: 64 or 32 rows, each its checkpoint block's scale).
  LinearWeight make_gate_up(const HostTensor& w) override {
    if (w.dtype == DType::kF8E4M3) {
      ++num_fp8_gate_ups;
      EXPECT_NE(w.scale_inv, nullptr);
      EXPECT_EQ(w.block_rows, std::gcd(w.shape[0] / 2, int64_t{128}));
      EXPECT_EQ(w.block_cols, 128);
    }
    return cpu_.make_gate_up(w);
  }
  void embedding(const Tensor& table, std::span<const TokenId> ids, Tensor& out) override {
    cpu_.embedding(table, ids, out);
  }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override { cpu_.rms_norm(x, w, eps, out); }
  void add(Tensor& x, const Tensor& y) override { cpu_.add(x, y); }
  void linear(const Tensor& x, const LinearWeight& w, Tensor& out) override { cpu_.linear(x, w, out); }
  void silu_mul(const Tensor& gate_up, Tensor& out) override { cpu_.silu_mul(gate_up, out); }
  void concat_cols(const Tensor& a, const Tensor& b, Tensor& out) override { cpu_.concat_cols(a, b, out); }
  void gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) override {
    cpu_.gather_rows(x, rows, out);
  }
  void mla_attention(const MlaAttentionArgs& args) override { cpu_.mla_attention(args); }
  void moe(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing) override {
    cpu_.moe(x, w, out, routing);
  }
  void read_cache_block(const LayerKvCache& cache, int32_t block, void* dst) override {
    cpu_.read_cache_block(cache, block, dst);
  }
  void write_cache_block(LayerKvCache& cache, int32_t block, const void* src) override {
    cpu_.write_cache_block(cache, block, src);
  }

  int num_fp8_linears = 0, num_fp8_gate_ups = 0;

 private:
  CpuBackend cpu_;
};

std::vector<float> prefill_logits(Backend& backend, const std::string& dir) {
  auto model = load_deepseek_model(dir, backend, 0, false);
  ForwardBatch b;
  const std::vector<TokenId> tokens = {3, 17, 42, 5, 99, 7, 1, 64};
  b.num_tokens = static_cast<int>(tokens.size());
  for (int i = 0; i < b.num_tokens; ++i) {
    b.token_ids.push_back(tokens[i]);
    b.positions.push_back(i);
    b.slot_mapping.push_back(i);
    b.token_seq.push_back(0);
  }
  b.block_tables.push_back({0});
  b.context_lens.push_back(b.num_tokens);
  b.logits_indices.push_back(b.num_tokens - 1);
  KvCaches caches = model->allocate_caches(1, 64);
  ForwardOutput out = model->forward(b, caches);
  std::vector<float> logits(out.logits.num_elements());
  backend.to_host(out.logits, logits.data());
  return logits;
}

TEST(RawFp8Loading, BackendGetsFp8WeightsWithScalesAndComputesTheSame) {
  const std::string dir = std::string(DSINFER_SOURCE_DIR) + "/tests/data/tiny_v3_fp8";
  CpuBackend widened;
  RawFp8CpuBackend raw;
  const std::vector<float> want = prefill_logits(widened, dir);
  const std::vector<float> got = prefill_logits(raw, dir);
  EXPECT_GT(raw.num_fp8_linears, 0);
  EXPECT_EQ(raw.num_fp8_gate_ups, 1 + 2 * (8 + 1));  // the dense layer's; 8 experts and a shared one in 2 layers
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "logit " << i;
}

}  // namespace
}  // namespace dsinfer
