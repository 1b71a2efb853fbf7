#include "backend/token_choice.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace dsinfer {

TokenId choose_token(const float* logits, int vocab, const RowSampling& row) {
  if (is_greedy(row)) {
    int best = 0;
    for (int i = 1; i < vocab; ++i)
      if (logits[i] > logits[best]) best = i;  // ties: the lowest id
    return best;
  }
  std::vector<int> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  const auto before = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  int n = vocab;
  if (row.top_k > 0 && row.top_k < vocab) {
    n = row.top_k;
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), before);
  } else {
    std::sort(idx.begin(), idx.end(), before);
  }
  const double inv_t = 1.0 / row.temperature;
  const double mx = logits[idx[0]];
  std::vector<double> probs(n);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += probs[i] = std::exp((logits[idx[i]] - mx) * inv_t);
  for (auto& q : probs) q /= sum;
  if (row.min_p > 0.0f) {
    const double floor = row.min_p * probs[0];
    int keep = 1;
    while (keep < n && probs[keep] >= floor) ++keep;
    n = keep;
  }
  if (row.top_p < 1.0f) {
    double cum = 0.0;
    int keep = 0;
    while (keep < n) {
      cum += probs[keep++];
      if (cum >= row.top_p) break;
    }
    n = std::max(1, keep);
  }
  double total = 0.0;
  for (int i = 0; i < n; ++i) total += probs[i];
  const double r = row.uniform * total;
  double acc = 0.0;
  for (int i = 0; i < n; ++i) {
    acc += probs[i];
    if (r < acc) return idx[i];
  }
  return idx[n - 1];
}

}  // namespace dsinfer
