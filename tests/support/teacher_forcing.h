// Teacher-forced greedy decoding of an HF reference fixture (tests/data/*/reference.json, or the
// longer reference_long.json of tools/make_long_reference.py): each prompt is prefilled, then
// every reference token is fed back one step at a time, counting the steps where the model's
// argmax is the reference's token.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "forward_batch_util.h"
#include "source_dir.h"
#include "model/deepseek_model.h"

namespace dsinfer::testing {

// 6 prompts x 24 greedy tokens, with the prefill's full logits (make_reference.py).
inline constexpr const char* kShortReference = "reference.json";
// 128 prompts of 1 to 200 tokens x 24 greedy tokens, without logits (make_long_reference.py).
inline constexpr const char* kLongReference = "reference_long.json";

// tests/data/<fixture> of the source tree (source_dir.h).
inline std::string fixture_dir(const std::string& fixture) {
  return test_support::source_dir() + "/tests/data/" + fixture;
}

inline bool reference_exists(const std::string& fixture_dir, const char* reference_file) {
  return std::filesystem::exists(fixture_dir + "/" + reference_file);
}

// A step whose argmax was not the reference's token.
struct TeacherForcedMiss {
  int prompt = 0, step = 0;  // step 0 reads the prefill's logits
  int prompt_length = 0;
  double reference_margin = 0;  // the reference's top-1/top-2 margin there
};

struct TeacherForcedAgreement {
  int num_steps = 0, num_agree = 0;
  int num_clear = 0, num_clear_agree = 0;  // steps whose reference top-2 margin passes clear_margin
  double largest_missed_margin = 0;         // the reference's top-2 margin at the clearest miss
  std::vector<TeacherForcedMiss> misses;
  // Per prompt: the logits after prefill, and where the reference holds them (reference.json
  // only) their largest |logit - reference| and the reference's largest |logit|.
  std::vector<std::vector<float>> prefill_logits;
  std::vector<double> prefill_errors, prefill_scales;
  std::vector<int> prompt_lengths;

  double agreement() const { return num_steps == 0 ? 0 : static_cast<double>(num_agree) / num_steps; }

  // "3050/3072 (99.28%), clear margins 2980/2980, 22 misses at reference margins <= 0.0123"
  std::string describe() const {
    std::ostringstream s;
    s << num_agree << "/" << num_steps << " (" << std::fixed;
    s.precision(2);
    s << 100 * agreement() << "%), clear margins " << num_clear_agree << "/" << num_clear << ", " << misses.size()
      << " misses";
    s.precision(4);
    if (!misses.empty()) s << " at reference margins <= " << largest_missed_margin;
    return s.str();
  }
};

// One step of a reference's path: its prompt's entry in the reference file, the step (0 reads
// the prefill's logits) and the model's logits there.
using ReferenceStepVisit =
    std::function<void(const nlohmann::json& prompt, size_t step, const std::vector<float>& logits)>;

// Walks a reference's path: each prompt prefilled, then every reference token but the last fed
// back one step at a time (the last token's own logits are not compared).
inline void walk_reference_path(DeepseekModel& model, const std::string& fixture_dir, const char* reference_file,
                                KvCacheFormat cache_format, const ReferenceStepVisit& visit) {
  constexpr int kBlockSize = 64;
  std::ifstream f(fixture_dir + "/" + reference_file);
  const auto ref = nlohmann::json::parse(f);
  std::vector<float> logits(model.config().vocab_size);
  for (const auto& p : ref["prompts"]) {
    std::vector<TokenId> tokens = p["prompt_ids"].get<std::vector<TokenId>>();
    const auto greedy = p["greedy_ids"].get<std::vector<TokenId>>();
    const int num_blocks = static_cast<int>((tokens.size() + greedy.size() + kBlockSize - 1) / kBlockSize);
    KvCaches caches = model.allocate_caches(num_blocks, kBlockSize, cache_format);
    int start = 0;
    for (size_t step = 0; step < greedy.size(); ++step) {
      ForwardOutput out = model.forward(single_sequence_batch(tokens, start, num_blocks, kBlockSize), caches);
      model.backend().to_host(out.logits, logits.data());
      visit(p, step, logits);
      if (step + 1 == greedy.size()) break;
      tokens.push_back(greedy[step]);  // follow the reference path
      start = static_cast<int>(tokens.size()) - 1;
    }
  }
}

inline TeacherForcedAgreement teacher_forced_agreement(DeepseekModel& model, const std::string& fixture_dir,
                                                       double clear_margin,
                                                       KvCacheFormat cache_format = KvCacheFormat::kF32,
                                                       const char* reference_file = kShortReference) {
  TeacherForcedAgreement a;
  walk_reference_path(model, fixture_dir, reference_file, cache_format,
                      [&](const nlohmann::json& p, size_t step, const std::vector<float>& logits) {
    const int prompt_length = static_cast<int>(p["prompt_ids"].size());
    if (step == 0) {
      if (p.contains("last_logits")) {
        const auto full = p["last_logits"].get<std::vector<double>>();
        double max_err = 0, scale = 0;
        for (size_t v = 0; v < full.size(); ++v) {
          max_err = std::max(max_err, std::abs(logits[v] - full[v]));
          scale = std::max(scale, std::abs(full[v]));
        }
        a.prefill_errors.push_back(max_err);
        a.prefill_scales.push_back(scale);
      }
      a.prefill_logits.push_back(logits);
      a.prompt_lengths.push_back(prompt_length);
    }
    const TokenId want = p["greedy_ids"][step].get<TokenId>();
    const double margin = p["greedy_margins"][step].get<double>();
    const int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ++a.num_steps;
    a.num_agree += next == want;
    if (next != want) {
      a.largest_missed_margin = std::max(a.largest_missed_margin, margin);
      const int prompt = static_cast<int>(a.prompt_lengths.size()) - 1;
      a.misses.push_back({prompt, static_cast<int>(step), prompt_length, margin});
    }
    if (margin > clear_margin) {
      ++a.num_clear;
      a.num_clear_agree += next == want;
    }
  });
  return a;
}

// The logits of every step of the reference path (walk_reference_path), with whether the step
// was a prompt's.
struct TeacherForcedLogits {
  std::vector<std::vector<float>> logits;  // per step: [vocab]
  std::vector<bool> is_prefill;
};

inline TeacherForcedLogits teacher_forced_logits(DeepseekModel& model, const std::string& fixture_dir,
                                                 const char* reference_file = kLongReference) {
  TeacherForcedLogits out;
  walk_reference_path(model, fixture_dir, reference_file, KvCacheFormat::kF32,
                      [&](const nlohmann::json&, size_t step, const std::vector<float>& logits) {
    out.logits.push_back(logits);
    out.is_prefill.push_back(step == 0);
  });
  return out;
}

// The median over a path's prompt steps (prefill) or other steps of the RMS distance of their
// logits from the reference path's.
inline double median_rms_distance(const TeacherForcedLogits& got, const TeacherForcedLogits& reference,
                                  bool prefill) {
  std::vector<double> d;
  for (size_t s = 0; s < reference.logits.size(); ++s) {
    if (reference.is_prefill[s] != prefill) continue;
    double sum = 0;
    for (size_t v = 0; v < reference.logits[s].size(); ++v) {
      const double e = static_cast<double>(got.logits[s][v]) - reference.logits[s][v];
      sum += e * e;
    }
    d.push_back(std::sqrt(sum / static_cast<double>(reference.logits[s].size())));
  }
  if (d.empty()) return 0;
  std::nth_element(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(d.size() / 2), d.end());
  return d[d.size() / 2];
}

}  // namespace dsinfer::testing
