// The router's weights for making its logits from o_proj's input (router_identity.cu).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/grouped_gemm.h"

namespace dsinfer::cuda {

// g_prime [num_experts, hidden] = gate [num_experts, hidden] times norm_w [hidden] per column;
// m [num_experts, in_features] = g_prime · W_o, with w_o o_proj's weight ([hidden, in_features]
// in its packed form, bf16 or e4m3).
void launch_router_identity(const float* gate, const float* norm_w, const GemmWeight& w_o, int num_experts,
                            int64_t hidden, int64_t in_features, float* g_prime, float* m, Stream stream);

}  // namespace dsinfer::cuda
