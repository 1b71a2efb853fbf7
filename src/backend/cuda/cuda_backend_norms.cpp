// Norms left to the products after them in steps of a few rows (CudaBackend::PendingNorm).
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_state.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_allocator.h"
#include "core/check.h"

namespace dsinfer::cuda {

namespace {
// Whether t's bytes overlap [p, p + bytes).
bool overlaps(const Tensor* t, const void* p, size_t bytes) {
  if (t == nullptr || t->empty() || p == nullptr) return false;
  const auto* begin = static_cast<const char*>(t->data);
  const auto* other = static_cast<const char*>(p);
  return begin < other + bytes && other < begin + t->num_bytes();
}

bool is_rows(const Tensor& t, int64_t rows, int64_t n) {
  return t.dtype == DType::kF32 && t.shape.size() == 2 && t.dim(0) == rows && t.dim(1) == n;
}
}  // namespace

bool CudaBackend::can_leave_norm(int64_t rows, int64_t n) const {
  return !f32_products_ && rows >= 1 && rows <= norms_in_products_max_rows_ && few_row_gemm_takes(rows) &&
         n % kLibraryFp8TileColumns == 0;
}

ResidualNormOutput CudaBackend::leave_norm(Tensor& residual, const Tensor& norm_w, float eps, Tensor& normed) {
  settle_norm();  // one pending norm at a time: one of other rows, still alive, is finished
  const int64_t rows = normed.dim(0), n = normed.dim(1);
  const Bf16Rows copy = start_normed_copy(normed);
  DS_CHECK(copy.data != nullptr && copy.ld == n);
  PendingNorm& p = pending_norm_;
  p.of = normed.data;
  p.keep = normed.storage;
  p.bf16 = normed_copy_.bf16;
  p.partials = alloc_->cached({rows, n / 4}, DType::kF32);
  p.scale = RowRmsScale{p.partials.as<float>(), static_cast<int>(n), eps};
  p.residual = residual.data;
  p.keep_residual = residual.storage;
  p.rows = rows;
  return ResidualNormOutput{residual.as<float>(), norm_w.as<float>(), normed.as<float>(), copy.data,
                            p.partials.as<float>()};
}

RowRmsScale CudaBackend::left_norm_scale(const void* rows) const {
  if (pending_norm_.of == nullptr || rows == nullptr) return {};
  if (rows == pending_norm_.of || rows == pending_norm_.bf16.data) return pending_norm_.scale;
  return {};
}

void CudaBackend::settle_norm() {
  if (pending_norm_.of == nullptr) return;
  PendingNorm p = std::move(pending_norm_);
  pending_norm_ = {};
  launch_apply_row_rms(p.scale, p.rows, static_cast<float*>(const_cast<void*>(p.of)), p.bf16.as<uint16_t>(),
                       stream_);
}

void CudaBackend::reconcile_norm(std::initializer_list<const Tensor*> reads,
                                 std::initializer_list<const Tensor*> writes) {
  const PendingNorm& p = pending_norm_;
  if (p.of == nullptr) return;
  // The output and the residual: fp32 [rows, n] each.
  const size_t bytes = static_cast<size_t>(p.rows) * p.scale.n * sizeof(float);
  bool read = false, overwritten = false, residual_written = false;
  for (const Tensor* t : reads)
    read = read || overlaps(t, p.of, bytes) || overlaps(t, p.bf16.data, p.bf16.num_bytes());
  for (const Tensor* t : writes) {
    overwritten = overwritten || overlaps(t, p.of, bytes);
    residual_written = residual_written || overlaps(t, p.residual, bytes);
  }
  if (read || (residual_written && !overwritten)) settle_norm();
  else if (overwritten) pending_norm_ = {};
}

void CudaBackend::linear_add_rms_norm(const Tensor& x, const LinearWeight& w, Tensor& out, Tensor& residual,
                                      const Tensor& norm_w, float eps, Tensor& normed) {
  const int64_t rows = x.dim(0), n = w.out_features;
  // The few-row kernel's CUDA-core forms write the residual and the norm's output.
  const bool leave = can_leave_norm(rows, n) && is_rows(residual, rows, n) && is_rows(normed, rows, n) &&
                     norm_w.num_elements() == n && norm_w.dtype == DType::kF32 &&
                     !(w.weight.dtype == DType::kF8E4M3 && few_row_mma_dense_) && w.weight.dim(0) == n &&
                     weight_terms(w) == 1;
  if (!leave) {
    Backend::linear_add_rms_norm(x, w, out, residual, norm_w, eps, normed);
    return;
  }
  DS_CHECK_MSG(x.dtype == DType::kF32 && x.dim(1) == w.in_features && !w.packed_gate_up,
               "linear_add_rms_norm: input width " << x.dim(1) << " vs " << w.in_features);
  // The output is overwritten: the norm before, which the layer's products read, ends here.
  reconcile_norm({&x}, {&residual, &normed});
  const GemmWeight g = gemm_weight_of(w);
  const Tensor xb = to_bf16_padded(x, g.k_padded);
  GroupedGemmArgs a = dense_product(xb, rows, w, GemmEpilogue::kStoreF32, nullptr, n, n);
  read_f32_rows(a, &x, rows);
  a.residual_norm = leave_norm(residual, norm_w, eps, normed);
  // The next MoE layer's router logits before the norm's factor, from this product's input, in
  // the same launch (will_route, RouterIdentity), where its residual part was made.
  RouteHint& hint = route_hint_;
  if (hint.pre_made && !hint.logits_made && rows == 1 && hint.id->o_proj == w.weight.data &&
      hint.residual == residual.data && hint.id->m.dim(1) == x.dim(1)) {
    RouterIdentity& id = *hint.id;
    const RouterLogitsRow logits{x.as<float>(),
                                 id.m.as<float>(),
                                 static_cast<int>(id.m.dim(1)),
                                 static_cast<int>(id.m.dim(0)),
                                 id.logits.as<float>(),
                                 id.pre.as<float>()};
    launch_router_logits_row_beside(logits, a, stream_);
    hint.logits_made = true;
    return;
  }
  launch_few_row_gemm(a, g.n_padded, 1, static_cast<int>(rows), stream_);
}

}  // namespace dsinfer::cuda
