// Teacher-forced greedy decoding of an HF reference fixture (tests/data/*/reference.json): each
// prompt is prefilled, then every reference token is fed back one step at a time, counting the
// steps where the model's argmax is the reference's token.
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forward_batch_util.h"
#include "model/deepseek_model.h"

namespace dsinfer::testing {

struct TeacherForcedAgreement {
  int num_steps = 0, num_agree = 0;
  int num_clear = 0, num_clear_agree = 0;  // steps whose reference top-2 margin passes clear_margin
  double largest_missed_margin = 0;         // the reference's top-2 margin at the clearest miss
  // Per prompt: the logits after prefill, their largest |logit - reference|, and the
  // reference's largest |logit|.
  std::vector<std::vector<float>> prefill_logits;
  std::vector<double> prefill_errors, prefill_scales;
  std::vector<int> prompt_lengths;
};

inline TeacherForcedAgreement teacher_forced_agreement(DeepseekModel& model, const std::string& fixture_dir,
                                                       double clear_margin,
                                                       KvCacheFormat cache_format = KvCacheFormat::kF32) {
  constexpr int kBlockSize = 64;
  std::ifstream f(fixture_dir + "/reference.json");
  const auto ref = nlohmann::json::parse(f);
  Backend& backend = model.backend();
  TeacherForcedAgreement a;
  std::vector<float> logits(model.config().vocab_size);
  for (const auto& p : ref["prompts"]) {
    std::vector<TokenId> tokens = p["prompt_ids"].get<std::vector<TokenId>>();
    const auto greedy = p["greedy_ids"].get<std::vector<TokenId>>();
    const auto margins = p["greedy_margins"].get<std::vector<double>>();
    const int total = static_cast<int>(tokens.size() + greedy.size());
    const int num_blocks = (total + kBlockSize - 1) / kBlockSize;
    KvCaches caches = model.allocate_caches(num_blocks, kBlockSize, cache_format);
    ForwardOutput out = model.forward(single_sequence_batch(tokens, 0, num_blocks, kBlockSize), caches);
    backend.to_host(out.logits, logits.data());
    const auto full = p["last_logits"].get<std::vector<double>>();
    double max_err = 0, scale = 0;
    for (size_t v = 0; v < full.size(); ++v) {
      max_err = std::max(max_err, std::abs(logits[v] - full[v]));
      scale = std::max(scale, std::abs(full[v]));
    }
    a.prefill_logits.push_back(logits);
    a.prompt_lengths.push_back(static_cast<int>(tokens.size()));
    a.prefill_errors.push_back(max_err);
    a.prefill_scales.push_back(scale);
    for (size_t step = 0; step < greedy.size(); ++step) {
      const int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ++a.num_steps;
      a.num_agree += next == greedy[step];
      if (next != greedy[step]) a.largest_missed_margin = std::max(a.largest_missed_margin, margins[step]);
      if (margins[step] > clear_margin) {
        ++a.num_clear;
        a.num_clear_agree += next == greedy[step];
      }
      tokens.push_back(greedy[step]);  // follow the reference path
      out = model.forward(single_sequence_batch(tokens, static_cast<int>(tokens.size()) - 1, num_blocks, kBlockSize),
                          caches);
      backend.to_host(out.logits, logits.data());
    }
  }
  return a;
}

}  // namespace dsinfer::testing
