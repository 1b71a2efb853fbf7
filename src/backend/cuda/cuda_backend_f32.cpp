// The CUDA backend's fp32 precision mode (DSINFER_CUDA_PRECISION=fp32): weights as the
// checkpoint's values widen to fp32, and every product in fp32 through gemm_f32.h. Attention,
// norms, the router and the combine take the batch-invariant forms, which are fp32 already.
#include <climits>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/gemm_f32.h"
#include "backend/cuda/grouped_gemm.h"
#include "core/status.h"

namespace dsinfer::cuda {

LinearWeight CudaBackend::f32_weight(const HostTensor& w, bool gate_up) {
  DS_CHECK(w.shape.size() == 2);
  DS_CHECK_MSG(!gate_up || w.shape[0] % 2 == 0, "gate/up weight with an odd row count " << w.shape[0]);
  DS_CHECK_MSG(w.shape[0] <= INT32_MAX && w.shape[1] <= INT32_MAX,
               "weight [" << w.shape[0] << ", " << w.shape[1] << "] too large");
  LinearWeight lw;
  lw.out_features = w.shape[0];
  lw.in_features = w.shape[1];
  lw.weight = from_host(w);  // fp32, FP8 block scales applied
  lw.packed_gate_up = gate_up;
  return lw;
}

void CudaBackend::prepare_f32(MoeWeights& w) {
  std::vector<const float*> table;
  for (const std::vector<LinearWeight>* weights : {&w.expert_gate_up, &w.expert_down}) {
    for (const LinearWeight& lw : *weights) {
      DS_CHECK_MSG(lw.weight.dtype == DType::kF32 && lw.weight.shape == weights->front().weight.shape,
                   "MoE experts of one layer must share shapes and dtype");
      table.push_back(lw.weight.as<float>());
    }
  }
  const size_t bytes = table.size() * sizeof(const float*);
  w.derived = alloc_->persistent_bytes(bytes);
  DS_CUDA_CHECK(cudaMemcpyAsync(w.derived.data, table.data(), bytes, cudaMemcpyHostToDevice, stream_));
  synchronize();  // the host table goes out of scope
}

void CudaBackend::product_f32(const float* x, int64_t rows, int64_t ldx, const LinearWeight& w, float* y,
                              int64_t ldy) {
  DS_CHECK_MSG(w.weight.dtype == DType::kF32, "fp32 products take weights made in the fp32 precision mode");
  GemmF32Args a;
  a.x = x;
  a.ldx = ldx;
  a.weight = w.weight.as<float>();
  a.rows = rows;
  a.n = static_cast<int>(w.out_features);
  a.k = static_cast<int>(w.in_features);
  a.y = y;
  a.ldy = ldy;
  launch_f32(a, (rows + kGemmF32RowsPerBlock - 1) / kGemmF32RowsPerBlock);
}

void CudaBackend::launch_f32(GemmF32Args args, int64_t max_row_blocks) {
  Tensor partials;
  if (const int64_t floats = gemm_f32_workspace_floats(args, max_row_blocks); floats > 0) {
    partials = alloc_->cached({floats}, DType::kF32);
    args.partials = partials.as<float>();
  }
  launch_gemm_f32(args, max_row_blocks, stream_);
}

void CudaBackend::gated_mlp_f32(const Tensor& x, const LinearWeight& gate_up, const LinearWeight& down, float* out,
                                int64_t ldo) {
  const int64_t rows = x.dim(0), inter = gate_up.out_features / 2;
  DS_CHECK_MSG(down.in_features == inter, "gated MLP: down projection takes " << down.in_features
                                                                             << " inputs, gate/up gives " << inter);
  Tensor gu = alloc_->cached({rows, 2 * inter}, DType::kF32);
  Tensor act = alloc_->cached({rows, inter}, DType::kF32);
  product_f32(x.as<float>(), rows, x.dim(1), gate_up, gu.as<float>(), 2 * inter);
  launch_silu_mul(gu.as<float>(), rows, inter, act.as<float>(), stream_);
  product_f32(act.as<float>(), rows, inter, down, out, ldo);
}

Tensor CudaBackend::moe_experts_f32(const MoeWeights& w, const Tensor& x, const int32_t* row_offsets,
                                    const int32_t* block_offsets, const int32_t* src_rows, int64_t num_entries) {
  const auto* table = static_cast<const float* const*>(w.derived.data);
  const LinearWeight& gu0 = w.expert_gate_up[0];
  const LinearWeight& down0 = w.expert_down[0];
  const int64_t inter = gu0.out_features / 2, hidden = down0.out_features;
  DS_CHECK(down0.in_features == inter && gu0.in_features == x.dim(1));
  const int64_t max_blocks = grouped_max_row_blocks(num_entries, kGemmF32RowsPerBlock, w.num_experts);
  Tensor gate_up = alloc_->cached({num_entries, 2 * inter}, DType::kF32);
  Tensor act = alloc_->cached({num_entries, inter}, DType::kF32);
  Tensor expert_out = alloc_->cached({num_entries, hidden}, DType::kF32);
  GemmF32Args up;
  up.x = x.as<float>();
  up.ldx = x.dim(1);
  up.rows = num_entries;
  up.src_rows = src_rows;
  up.groups = table;
  up.row_offsets = row_offsets;
  up.block_offsets = block_offsets;
  up.num_groups = w.num_experts;
  up.n = static_cast<int>(2 * inter);
  up.k = static_cast<int>(gu0.in_features);
  up.y = gate_up.as<float>();
  up.ldy = 2 * inter;
  launch_f32(up, max_blocks);
  launch_silu_mul(gate_up.as<float>(), num_entries, inter, act.as<float>(), stream_);
  GemmF32Args down = up;
  down.x = act.as<float>();
  down.ldx = inter;
  down.src_rows = nullptr;
  down.groups = table + w.num_experts;
  down.n = static_cast<int>(hidden);
  down.k = static_cast<int>(inter);
  down.y = expert_out.as<float>();
  down.ldy = hidden;
  launch_f32(down, max_blocks);
  return expert_out;
}

}  // namespace dsinfer::cuda
