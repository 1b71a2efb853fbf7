// The router's weights rewritten for making its logits from o_proj's input (CudaBackend::
// RouterIdentity): the norm after o_proj scales the new residual h + o by one factor a row and
// by its weight per column, so the logits are (G' · h + M · a) / rms with G' = gate ·
// diag(norm weight) and M = G' · W_o, where a is o_proj's input. Made once per MoE layer, in
// fp32, each sum in one order.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/latent_entry.cuh"
#include "backend/cuda/router_identity.h"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) gate_times_norm_kernel(const float* gate, const float* norm_w,
                                                                   int64_t hidden, int64_t count, float* g_prime) {
  await_previous_kernels();
  const int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (i < count) g_prime[i] = gate[i] * norm_w[i % hidden];
}

// Block (expert e, 128 columns of a): M[e][j] = sum over o_proj's outputs c, in order, of
// G'[e][c] · W_o[c][j], W_o's values as the products read them (e4m3 codes times their block's
// scale, packed rows c = source rows).
__global__ void __launch_bounds__(kThreads) router_from_input_kernel(const float* g_prime, GemmWeight w_o,
                                                                     int64_t hidden, int64_t in_features,
                                                                     float* m) {
  await_previous_kernels();
  const int e = blockIdx.x;
  const int64_t j = blockIdx.y * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (j >= in_features) return;
  const float* g = g_prime + e * hidden;
  const int64_t scale_cols = (w_o.k_padded + kScaleCols - 1) / kScaleCols;
  float acc = 0.0f;
  for (int64_t c = 0; c < hidden; ++c) {
    float w;
    if (w_o.scales != nullptr) {
      const uint8_t code = static_cast<const uint8_t*>(w_o.data)[c * w_o.k_padded + j];
      w = fp8_to_float(code) * w_o.scales[(c / 16) * scale_cols + j / kScaleCols];
    } else {
      const uint16_t bits = static_cast<const uint16_t*>(w_o.data)[c * w_o.k_padded + j];
      w = __uint_as_float(static_cast<uint32_t>(bits) << 16);
    }
    acc = fmaf(g[c], w, acc);
  }
  m[e * in_features + j] = acc;
}

}  // namespace

void launch_router_identity(const float* gate, const float* norm_w, const GemmWeight& w_o, int num_experts,
                            int64_t hidden, int64_t in_features, float* g_prime, float* m, Stream stream) {
  DS_CHECK(num_experts > 0 && hidden > 0 && in_features > 0 && w_o.k_padded >= in_features &&
           w_o.n_padded >= hidden);
  const int64_t count = num_experts * hidden;
  launch_kernel(gate_times_norm_kernel, static_cast<unsigned>((count + kThreads - 1) / kThreads), kThreads, 0,
                stream, gate, norm_w, hidden, count, g_prime);
  DS_CUDA_CHECK_LAUNCH();
  const dim3 grid(num_experts, static_cast<unsigned>((in_features + kThreads - 1) / kThreads));
  launch_kernel(router_from_input_kernel, grid, kThreads, 0, stream, g_prime, w_o, hidden, in_features, m);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
