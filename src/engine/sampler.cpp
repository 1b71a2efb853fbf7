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

RowSampling row_sampling(const SamplingParams& p, SamplerState& state) {
  RowSampling row{p.temperature, p.top_k, p.top_p, p.min_p, 0.0};
  if (!is_greedy(row)) row.uniform = state.next_uniform();
  return row;
}

void token_logprobs(const float* logits, int vocab, TokenId chosen, int num_top, TokenLogprob* out) {
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

TokenId sample_token(const float* logits, int vocab, const SamplingParams& p, SamplerState& state,
                     TokenLogprob* logprob) {
  const TokenId chosen = choose_token(logits, vocab, row_sampling(p, state));
  if (logprob != nullptr) token_logprobs(logits, vocab, chosen, p.num_logprobs, logprob);
  return chosen;
}

}  // namespace dsinfer
