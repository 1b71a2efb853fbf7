// The CUDA backend (Hopper, sm_90a), checked op by op against the CPU backend.
//
// Choices of this first version:
// - Activations are fp32 device tensors, as the model allocates them; `linear` converts its
//   input to bf16 (or quantises it to FP8 per 1x128 tile) on the fly, so every GEMM reads
//   narrow operands while norms, softmax and residual sums stay fp32.
// - Weights from make_linear are bf16 [out, in]; F8_E4M3 checkpoint weights stay FP8 with their
//   128x128 block scales when cuBLASLt offers the block-scaled FP8 matmul for the shape
//   (padded to out % 4 == 0, in % 128 == 0), else they are dequantised to bf16 on upload.
// - Other tensors (norm weights, embeddings, router, W_UK/W_UV, RoPE tables) are fp32.
// - The paged latent cache is fp32, so read_cache_block/write_cache_block are plain copies.
// - All work runs on one stream; the host waits only in to_host, in cache block reads and in
//   moe (which needs the routing on the host to plan its per-expert GEMMs).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {

class DeviceAllocator;
class LtMatmul;

class CudaBackend final : public Backend {
 public:
  CudaBackend();
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  bool wants_raw_fp8() const override { return true; }

  Tensor empty(const std::vector<int64_t>& shape, DType dtype) override;
  Tensor from_host(const HostTensor& host) override;
  void to_host(const Tensor& t, float* dst) override;
  LinearWeight make_linear(const HostTensor& w) override;

  void embedding(const Tensor& table, std::span<const TokenId> ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void linear(const Tensor& x, const LinearWeight& w, Tensor& out) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void concat_cols(const Tensor& a, const Tensor& b, Tensor& out) override;
  void gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) override;
  void mla_attention(const MlaAttentionArgs& args) override;
  void moe(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing) override;

  void read_cache_block(const LayerKvCache& cache, int32_t block, float* dst) override;
  void write_cache_block(LayerKvCache& cache, int32_t block, const float* src) override;

  void synchronize();

 private:
  // Copies host ints to a fresh device tensor (stream-ordered).
  Tensor upload_ints(const std::vector<int32_t>& v);
  Tensor view_rows(const Tensor& t, int64_t row_begin, int64_t num_rows) const;
  LinearWeight make_fp8_linear(const HostTensor& w);
  LinearWeight make_bf16_linear(const HostTensor& w);
  bool fp8_matmul_works();

  Stream stream_ = nullptr;
  int num_sms_ = 132;
  bool warned_fp8_fallback_ = false;
  int fp8_state_ = 0;  // 0 not yet probed, 1 FP8 matmul verified, -1 dequantise FP8 to bf16
  std::shared_ptr<DeviceAllocator> alloc_;
  std::unique_ptr<LtMatmul> matmul_;
};

}  // namespace dsinfer::cuda
