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
  const int64_t rows = logits.dim(0), n = logits.dim(1);
  std::vector<float> host(static_cast<size_t>(rows * n));
  to_host(logits, host.data());
  out.assign(static_cast<size_t>(rows), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = host.data() + r * n;
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
      if (row[i] > row[best]) best = i;  // the first maximum wins, as in the sampler
    out[r] = static_cast<int32_t>(best);
  }
}

}  // namespace dsinfer
