// A MoE layer's router logits made from o_proj's input in one-token steps
// (CudaBackend::RouterIdentity): the part of the logits from the residual beside the layer's
// first pair of products, the part from o_proj's input beside o_proj, the norm's factor in the
// routing. Why: at batch 1 the logits were a launch of their own between o_proj and the routing,
// a link of the layer's chain. Without it V2-Lite's batch-1 decode runs 2.8% faster with FP8
// weights and 1.3% with bf16 (bench/RESULTS.md, "Two launches of a batch-1 MoE layer taken
// out", where a timing proxy also bounds what more the shared experts' placement could give).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_state.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/router_identity.h"

namespace dsinfer::cuda {

void CudaBackend::prepare_router(MoeWeights& moe, const LinearWeight& o_proj, const Tensor& norm_w) {
  // A layer of an earlier model may have stood at this address.
  router_identities_.erase(&moe);
  if (f32_products_ || !router_beside_o_proj_ || !moe.has_shared || moe.gate.dtype != DType::kF32 ||
      norm_w.dtype != DType::kF32)
    return;
  if ((o_proj.weight.dtype != DType::kBF16 && o_proj.weight.dtype != DType::kF8E4M3) || weight_terms(o_proj) != 1)
    return;
  const int64_t hidden = moe.gate.dim(1), in_features = o_proj.in_features;
  // M · a reads M in fp32 in every step: worth it where M is not much larger than the gate
  // (V2-Lite's o_proj is 2,048 × 2,048; V3's takes 16,384 columns to 7,168, and keeps the
  // logits' own launch).
  if (o_proj.out_features != hidden || norm_w.num_elements() != hidden || in_features > 2 * hidden) return;
  RouterIdentity id;
  id.g_prime = alloc_->persistent({moe.num_experts, hidden}, DType::kF32);
  id.m = alloc_->persistent({moe.num_experts, in_features}, DType::kF32);
  id.pre = alloc_->persistent({1, moe.num_experts}, DType::kF32);
  id.logits = alloc_->persistent({1, moe.num_experts}, DType::kF32);
  id.o_proj = o_proj.weight.data;
  id.gate = moe.gate.data;
  launch_router_identity(moe.gate.as<float>(), norm_w.as<float>(), gemm_weight_of(o_proj), moe.num_experts, hidden,
                         in_features, id.g_prime.as<float>(), id.m.as<float>(), stream_);
  synchronize();
  router_identities_[&moe] = std::move(id);
}

void CudaBackend::will_route(const MoeWeights& moe, const Tensor& residual) {
  route_hint_ = {};
  const auto it = router_identities_.find(&moe);
  if (it == router_identities_.end() || it->second.gate != moe.gate.data || batch_invariant_ ||
      residual.dtype != DType::kF32 || residual.shape.size() != 2 || residual.dim(0) != 1 ||
      residual.dim(1) != it->second.g_prime.dim(1))
    return;
  route_hint_.moe = &moe;
  route_hint_.id = &it->second;
  route_hint_.residual = residual.data;
}

}  // namespace dsinfer::cuda
