// Default implementations of the Backend operations that are compositions of others.
#include "backend/backend.h"

#include "core/check.h"

namespace dsinfer {

void Backend::gated_mlp(const Tensor& x, const LinearWeight& gate_up, const LinearWeight& down, Tensor& out) {
  const int64_t rows = x.dim(0);
  Tensor gu = empty({rows, gate_up.out_features}, DType::kF32);
  linear(x, gate_up, gu);
  Tensor act = empty({rows, gate_up.out_features / 2}, DType::kF32);
  silu_mul(gu, act);
  linear(act, down, out);
}

void Backend::argmax_rows(const Tensor& logits, std::vector<int32_t>& out) {
  const std::vector<RowSampling> greedy(static_cast<size_t>(logits.dim(0)));
  Backend::sample_rows(logits, greedy, out);
}

void Backend::sample_rows(const Tensor& logits, std::span<const RowSampling> rows, std::vector<int32_t>& out) {
  const int64_t num_rows = logits.dim(0), vocab = logits.dim(1);
  DS_CHECK_MSG(static_cast<int64_t>(rows.size()) == num_rows,
               "sample_rows: " << rows.size() << " parameter rows for " << num_rows << " logit rows");
  std::vector<float> host(static_cast<size_t>(num_rows * vocab));
  to_host(logits, host.data());
  out.assign(static_cast<size_t>(num_rows), 0);
  for (int64_t r = 0; r < num_rows; ++r) out[r] = choose_token(host.data() + r * vocab, static_cast<int>(vocab), rows[r]);
}

}  // namespace dsinfer
