#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace dsinfer {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

int argmax(const float* v, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;  // ties: the lowest id
  return best;
}

void fill_logprobs(const float* logits, int vocab, TokenId chosen, int num_top, TokenLogprob* out) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double log_z = mx + std::log(sum);
  out->token_id = chosen;
  out->logprob = static_cast<float>(logits[chosen] - log_z);
  out->top.clear();
  if (num_top <= 0) return;
  num_top = std::min(num_top, vocab);
  std::vector<int> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + num_top, idx.end(),
                    [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (int i = 0; i < num_top; ++i) out->top.emplace_back(idx[i], static_cast<float>(logits[idx[i]] - log_z));
}

}  // namespace

SamplerState::SamplerState(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t SamplerState::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double SamplerState::next_uniform() { return (next_u64() >> 11) * 0x1.0p-53; }

TokenId sample_token(const float* logits, int vocab, const SamplingParams& p, SamplerState& state,
                     TokenLogprob* logprob) {
  TokenId chosen;
  if (p.temperature <= 0.0f || p.top_k == 1) {
    chosen = argmax(logits, vocab);
  } else {
    // Candidates sorted by logit (descending, ties by id), then truncated by top-k, top-p, min-p.
    std::vector<int> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    int n = vocab;
    if (p.top_k > 0 && p.top_k < vocab) {
      n = p.top_k;
      std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                        [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    } else {
      std::sort(idx.begin(), idx.end(),
                [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    }
    const double inv_t = 1.0 / p.temperature;
    const double mx = logits[idx[0]];
    std::vector<double> probs(n);
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += probs[i] = std::exp((logits[idx[i]] - mx) * inv_t);
    for (auto& q : probs) q /= sum;
    if (p.min_p > 0.0f) {
      const double floor = p.min_p * probs[0];
      int keep = 1;
      while (keep < n && probs[keep] >= floor) ++keep;
      n = keep;
    }
    if (p.top_p < 1.0f) {
      double cum = 0.0;
      int keep = 0;
      while (keep < n) {
        cum += probs[keep++];
        if (cum >= p.top_p) break;
      }
      n = std::max(1, keep);
    }
    double total = 0.0;
    for (int i = 0; i < n; ++i) total += probs[i];
    const double r = state.next_uniform() * total;
    double acc = 0.0;
    chosen = idx[n - 1];
    for (int i = 0; i < n; ++i) {
      acc += probs[i];
      if (r < acc) {
        chosen = idx[i];
        break;
      }
    }
  }
  if (logprob != nullptr) fill_logprobs(logits, vocab, chosen, p.num_logprobs, logprob);
  return chosen;
}

}  // namespace dsinfer
