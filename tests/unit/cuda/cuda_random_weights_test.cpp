// Random weights made on the device (make_random_linear, --dummy-weights) against the same
// values drawn on the host and packed by make_linear / make_gate_up: the device's logarithm,
// sine and cosine may differ in their last bits, so a few codes may sit one step apart, and
// nothing more. Plain and gate/up weights, bf16 and e4m3 (blocks cut short at the edges and,
// in a gate/up of 96-row halves, at the up's first row; padding rows and columns), through the
// few-row kernel and cuBLASLt, and a whole random model.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/random_normal.h"
#include "cuda_test_util.h"
#include "model/deepseek_model.h"
#include "model/deepseek_weights.h"
#include "model/model_config.h"

namespace dsinfer {
namespace {

using testing_cuda::bf16_values;
using testing_cuda::CudaVsCpuTest;
using testing_cuda::download;
using testing_cuda::make_backend_with_env;
using testing_cuda::random_values;
using testing_cuda::relative_error;
using testing_cuda::upload;

// The spec's source tensor(s) drawn on the host: [rows, cols], gate/up stacked gate first.
std::vector<float> host_values(const RandomLinearSpec& spec) {
  const int64_t rows = spec.out_features, cols = spec.in_features;
  std::vector<float> v;
  for (int t = 0; t < (spec.gate_up ? 2 : 1); ++t)
    for (int64_t i = 0; i < rows * cols; ++i) v.push_back(spec.scale * normal_value(spec.seeds[t], i));
  return v;
}

// Those values as an FP8 checkpoint stores them: e4m3 with a scale per 128 × 128 block.
struct HostFp8 {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};
HostFp8 quantise(const std::vector<float>& v, int64_t rows, int64_t cols) {
  const int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
  HostFp8 q;
  q.scales.assign(rb * cb, 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& s = q.scales[(r / 128) * cb + c / 128];
      s = std::max(s, std::abs(v[r * cols + c]));
    }
  for (float& s : q.scales) s = e4m3_block_scale(s);
  for (int64_t i = 0; i < rows * cols; ++i)
    q.codes.push_back(f32_to_fp8e4m3(v[i] / q.scales[(i / cols / 128) * cb + i % cols / 128]));
  return q;
}

// The packed codes of a weight (bf16 or e4m3 [n_padded, k_padded]), as unsigned integers.
std::vector<int> packed_codes(const LinearWeight& w) {
  const size_t elem = w.weight.dtype == DType::kF8E4M3 ? 1 : 2;
  std::vector<uint8_t> bytes(w.weight.num_elements() * elem);
  EXPECT_EQ(cudaMemcpy(bytes.data(), w.weight.data, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<int> codes(w.weight.num_elements());
  for (size_t i = 0; i < codes.size(); ++i) {
    uint16_t code = bytes[i * elem];
    if (elem == 2) code |= static_cast<uint16_t>(bytes[i * elem + 1]) << 8;
    codes[i] = code;
  }
  return codes;
}

class CudaRandomWeightsTest : public CudaVsCpuTest {};

TEST_F(CudaRandomWeightsTest, DeviceFilledWeightsHoldTheHostDrawnValues) {
  struct Case {
    int64_t rows, cols;
    bool gate_up, fp8;
  };
  for (const Case c : {Case{96, 200, false, false}, Case{576, 2048, false, false}, Case{40, 90, true, false},
                       Case{576, 300, false, true}, Case{512, 2048, false, true}, Case{256, 200, true, true},
                       Case{96, 200, true, true}}) {
    SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + (c.gate_up ? " gate/up" : "") +
                 (c.fp8 ? " e4m3" : " bf16"));
    RandomLinearSpec spec;
    spec.out_features = c.rows;
    spec.in_features = c.cols;
    spec.seeds[0] = 0x1234 + c.rows;
    spec.seeds[1] = 0x9876 + c.cols;
    spec.scale = 1.0f / std::sqrt(static_cast<float>(c.cols));
    spec.gate_up = c.gate_up;
    spec.fp8 = c.fp8;
    Backend& be = *gpu_;
    const std::optional<LinearWeight> made = be.make_random_linear(spec);
    ASSERT_TRUE(made.has_value());
    const std::vector<float> values = host_values(spec);
    const int64_t source_rows = c.gate_up ? 2 * c.rows : c.rows;
    HostFp8 q;
    // bf16: the values rounded to bf16 here, the codes packing gives them, so that make_linear
    // keeps them in the one bf16 term the device fills (values that bf16 would round take two).
    const std::vector<float> rounded = bf16_values(values);
    HostTensor h{DType::kF32, {source_rows, c.cols}, rounded.data()};
    if (c.fp8 && c.gate_up) {
      // Each half quantised as a checkpoint's tensor, stacked as the loader stacks them: in scale
      // blocks of gcd(inter, 128) rows, none spanning both halves.
      const int64_t half = c.rows * c.cols, block_rows = std::gcd(c.rows, int64_t{128}), cb = (c.cols + 127) / 128;
      for (int t = 0; t < 2; ++t) {
        const HostFp8 qt = quantise({values.begin() + t * half, values.begin() + (t + 1) * half}, c.rows, c.cols);
        q.codes.insert(q.codes.end(), qt.codes.begin(), qt.codes.end());
        for (int64_t b = 0; b < (c.rows + block_rows - 1) / block_rows; ++b) {
          const auto source = qt.scales.begin() + (b * block_rows / 128) * cb;
          q.scales.insert(q.scales.end(), source, source + cb);
        }
      }
      h = HostTensor{DType::kF8E4M3, {source_rows, c.cols}, q.codes.data(), q.scales.data(),
                     static_cast<int>(block_rows), 128};
    } else if (c.fp8) {
      q = quantise(values, source_rows, c.cols);
      h = HostTensor{DType::kF8E4M3, {source_rows, c.cols}, q.codes.data(), q.scales.data(), 128, 128};
    }
    const LinearWeight packed = c.gate_up ? be.make_gate_up(h) : be.make_linear(h);
    ASSERT_EQ(made->weight.dtype, packed.weight.dtype);
    ASSERT_EQ(made->weight.shape, packed.weight.shape);
    EXPECT_EQ(made->out_features, packed.out_features);
    EXPECT_EQ(made->packed_gate_up, packed.packed_gate_up);
    // The packed codes: equal but for a few one step apart.
    const std::vector<int> got = packed_codes(*made), want = packed_codes(packed);
    int64_t num_differ = 0, num_nonzero = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      num_nonzero += want[i] != 0;
      if (got[i] == want[i]) continue;
      ++num_differ;
      EXPECT_LE(std::abs(got[i] - want[i]), 1) << "element " << i;
    }
    // Every source value lands in the layout (bf16 never rounds one to zero, e4m3 about one in
    // 10^5); the rest of it is padding.
    EXPECT_GE(num_nonzero, 0.99 * static_cast<double>(source_rows * c.cols));
    EXPECT_LE(num_differ, static_cast<int64_t>(got.size()) / 1000);
    // Their products (the few-row kernel at one row, the tensor-core kernel or cuBLASLt at 64,
    // the latter reading cuBLASLt's copy of the scales), or gate/up through a gated MLP.
    const int64_t n_out = c.gate_up ? c.rows : source_rows;
    for (int64_t m : {1, 64}) {
      const auto x = random_values(m * c.cols, 7 + static_cast<uint32_t>(m));
      Tensor tx = upload(be, {m, c.cols}, x);
      Tensor y_made = be.empty({m, c.gate_up ? c.cols : n_out}, DType::kF32);
      Tensor y_packed = be.empty({m, c.gate_up ? c.cols : n_out}, DType::kF32);
      if (c.gate_up) {
        const auto wd = bf16_values(random_values(c.cols * c.rows, 8, 0.1f));
        const LinearWeight down = be.make_linear(HostTensor{DType::kF32, {c.cols, c.rows}, wd.data()});
        be.gated_mlp(tx, *made, down, y_made);
        be.gated_mlp(tx, packed, down, y_packed);
      } else {
        be.linear(tx, *made, y_made);
        be.linear(tx, packed, y_packed);
      }
      EXPECT_LT(relative_error(download(be, y_made), download(be, y_packed)), c.fp8 ? 2e-2 : 2e-3)
          << m << " rows";
    }
  }
}

// A random model made with its linear weights on the device gives the logits of the same model
// drawn on the host (DSINFER_DEVICE_RANDOM_WEIGHTS=0), in bf16 and with FP8 projections.
TEST_F(CudaRandomWeightsTest, RandomModelMatchesTheHostDrawnOne) {
  const ModelConfig config = ModelConfig::load(testing_cuda::source_dir() + "/tests/data/tiny_v3");
  // In one bf16 term, as the device draws them (the host's fp32 values would take two).
  auto host_drawn = [] {
    testing_cuda::ScopedEnv one_term("DSINFER_CUDA_WEIGHT_TERMS", "1");
    return make_backend_with_env("cuda", "DSINFER_DEVICE_RANDOM_WEIGHTS", "0");
  }();
  for (const bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "FP8 projections" : "bf16");
    Backend* bes[2] = {gpu_.get(), host_drawn.get()};
    std::vector<float> logits[2];
    for (int b = 0; b < 2; ++b) {
      DeepseekModel model(config, make_random_weights(config, *bes[b], 21, fp8), *bes[b], 256);
      KvCaches caches = model.allocate_caches(4, 64, KvCacheFormat::kF32);
      ForwardBatch batch;
      for (int p = 0; p < 40; ++p) {
        batch.token_ids.push_back((p * 11 + 3) % config.vocab_size);
        batch.positions.push_back(p);
        batch.slot_mapping.push_back(64 + p);
        batch.token_seq.push_back(0);
      }
      batch.block_tables.push_back({1});
      batch.context_lens.push_back(40);
      batch.logits_indices = {39};
      batch.num_tokens = 40;
      logits[b] = download(*bes[b], model.forward(batch, caches).logits);
    }
    EXPECT_LT(relative_error(logits[0], logits[1]), 2e-2);
  }
}

}  // namespace
}  // namespace dsinfer
