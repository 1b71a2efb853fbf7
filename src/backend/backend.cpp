// Default implementations of the Backend operations that are compositions of others.
#include "backend/backend.h"

#include <algorithm>

#include "core/check.h"

namespace dsinfer {

void Backend::add_rms_norm(Tensor& x, const Tensor& y, const Tensor& w, float eps, Tensor& out) {
  add(x, y);
  rms_norm(x, w, eps, out);
}

void Backend::linear_add_rms_norm(const Tensor& x, const LinearWeight& w, Tensor& out, Tensor& residual,
                                  const Tensor& norm_w, float eps, Tensor& normed) {
  linear(x, w, out);
  add_rms_norm(residual, out, norm_w, eps, normed);
}

void Backend::moe_add_rms_norm(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing,
                               Tensor& residual, const Tensor& norm_w, float eps, Tensor& normed) {
  moe(x, w, out, routing);
  add_rms_norm(residual, out, norm_w, eps, normed);
}

void Backend::linear_pair(const Tensor& x, const LinearWeight& w1, Tensor& out1, const LinearWeight& w2,
                          Tensor& out2) {
  linear(x, w1, out1);
  linear(x, w2, out2);
}

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
  sample_rows(logits, greedy, out);
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

void Backend::check_logit_penalties(const Tensor& logits, std::span<const LogitPenalty> penalties) {
  DS_CHECK(logits.dtype == DType::kF32 && logits.shape.size() == 2);
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  for (const LogitPenalty& p : penalties) {
    DS_CHECK_MSG(p.row >= 0 && p.row < rows && p.token >= 0 && p.token < vocab,
                 "logit penalty at row " << p.row << ", token " << p.token << " of [" << rows << ", " << vocab << "]");
  }
}

uint64_t Backend::choose_async(const Tensor& logits, std::span<const RowSampling> rows) {
  std::vector<int32_t> ids;
  sample_rows(logits, rows, ids);
  latest_choice_ = ids;
  const uint64_t ticket = next_ticket_++;
  choices_.emplace(ticket, std::move(ids));
  return ticket;
}

std::vector<int32_t> Backend::wait_choice(uint64_t ticket) {
  auto it = choices_.find(ticket);
  DS_CHECK_MSG(it != choices_.end(), "wait_choice: unknown ticket " << ticket);
  std::vector<int32_t> ids = std::move(it->second);
  choices_.erase(it);
  return ids;
}

std::span<const TokenId> Backend::input_ids(const ForwardBatch& batch) {
  bool placeholders = false;
  for (TokenId id : batch.token_ids) placeholders = placeholders || id < 0;
  if (!placeholders) return batch.token_ids;
  // resize + copy keeps the buffer (and the span a device backend compares against) in place
  // when the same batch is resolved again.
  resolved_ids_.resize(batch.token_ids.size());
  std::copy(batch.token_ids.begin(), batch.token_ids.end(), resolved_ids_.begin());
  for (TokenId& id : resolved_ids_) {
    if (id >= 0) continue;
    const size_t row = static_cast<size_t>(-1 - id);
    DS_CHECK_MSG(row < latest_choice_.size(), "token placeholder for row " << row << " of a choice of "
                                                                           << latest_choice_.size() << " rows");
    id = latest_choice_[row];
  }
  return resolved_ids_;
}

}  // namespace dsinfer
