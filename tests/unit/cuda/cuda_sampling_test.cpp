// Token choice on the CUDA backend against the CPU reference (choose_token on copied logits):
// every kind of row (greedy, temperature alone, top-k, top-p, min-p and their mixes, tied
// maxima) in one call, with each row's own draw, at a small vocabulary and at V2's.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>

#include "cuda_test_util.h"

namespace dsinfer {
namespace {

using testing_cuda::CudaVsCpuTest;
using testing_cuda::random_values;
using testing_cuda::upload;

class CudaSamplingTest : public CudaVsCpuTest {
 protected:
  void run_case(int num_rows, int vocab, uint32_t seed) {
    auto logits = random_values(static_cast<size_t>(num_rows) * vocab, seed, 3.0f);
    const RowSampling kinds[] = {
        {0.0f, 0, 1.0f, 0.0f, 0.0},    // greedy
        {0.8f, 1, 1.0f, 0.0f, 0.0},    // top_k 1: greedy whatever the temperature
        {1.0f, 0, 1.0f, 0.0f, 0.0},    // the whole vocabulary
        {0.7f, 0, 1.0f, 0.0f, 0.0},    // temperature alone
        {1.3f, 50, 1.0f, 0.0f, 0.0},   // top-k
        {1.0f, 0, 0.9f, 0.0f, 0.0},    // top-p
        {1.0f, 0, 1.0f, 0.05f, 0.0},   // min-p
        {0.9f, 200, 0.8f, 0.02f, 0.0}, // all three
        {0.5f, 0, 0.5f, 0.0f, 0.0},    // a narrow nucleus
        {2.0f, 3, 1.0f, 0.0f, 0.0},    // a top-k smaller than a tile
    };
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::vector<RowSampling> rows;
    for (int r = 0; r < num_rows; ++r) {
      RowSampling row = kinds[r % std::size(kinds)];
      row.uniform = uniform(rng);
      rows.push_back(row);
      // Every fifth row: its largest logit twice, the lower id must win a greedy choice.
      if (r % 5 == 4) {
        float* row_logits = logits.data() + static_cast<size_t>(r) * vocab;
        const float best = *std::max_element(row_logits, row_logits + vocab) + 1.0f;
        row_logits[vocab / 3] = best;
        row_logits[vocab / 2] = best;
      }
    }
    std::vector<int32_t> got[2];
    Backend* bes[2] = {cpu_.get(), gpu_.get()};
    for (int b = 0; b < 2; ++b) {
      Tensor t = upload(*bes[b], {num_rows, vocab}, logits);
      bes[b]->sample_rows(t, rows, got[b]);
    }
    ASSERT_EQ(got[0].size(), static_cast<size_t>(num_rows));
    int not_argmax = 0;
    for (int r = 0; r < num_rows; ++r) {
      EXPECT_EQ(got[1][r], got[0][r]) << "row " << r << " (kind " << r % std::size(kinds) << ")";
      const float* row_logits = logits.data() + static_cast<size_t>(r) * vocab;
      not_argmax += got[0][r] != std::max_element(row_logits, row_logits + vocab) - row_logits;
    }
    // The draws must matter: most sampled rows pick something other than the argmax.
    EXPECT_GT(not_argmax, num_rows / 4);
  }
};

// Steps of greedy rows only take the argmax kernel: a step of up to 32 rows cuts each row over
// blocks of a few thousand logits and meets their bests in the row's last block, larger steps
// take a block a row. The choice must be the reference's in both forms: the largest logit, the
// lowest id on ties, ties placed in different blocks' slices and at a slice's edge, the best at
// the last logit, a row of one value, NaN (which never wins past the first logit), and
// vocabularies that are not whole vectors. Each case runs twice, so the second launch finds the
// arrival counters set back to zero by the first.
TEST_F(CudaSamplingTest, GreedyRowsMatchTheReferenceChoice) {
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  for (const int vocab : {5003, 102400, 129280, 300000}) {
    for (const int num_rows : {1, 3, 32, 33}) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + ", " + std::to_string(num_rows) + " rows");
      auto logits = random_values(static_cast<size_t>(num_rows) * vocab, vocab + num_rows, 3.0f);
      for (int r = 0; r < num_rows; ++r) {
        float* row = logits.data() + static_cast<size_t>(r) * vocab;
        const float best = *std::max_element(row, row + vocab) + 1.0f;
        if (r % 6 == 0) {  // the last logit
          row[vocab - 1] = best;
        } else if (r % 6 == 1) {  // a tie across slices
          row[vocab / 2] = row[vocab / 3] = best;
        } else if (r % 6 == 2) {  // a tie across the edge of V2's first two slices
          row[4096] = row[4095] = best;
        } else if (r % 6 == 3) {  // one value: id 0
          std::fill(row, row + vocab, -2.5f);
        } else if (r % 6 == 4) {
          row[7] = row[vocab / 2] = kNan;
          row[vocab / 4] = best;
        }  // else the random maximum
      }
      std::vector<RowSampling> rows(num_rows);  // greedy
      std::vector<int32_t> want, got;
      Tensor cpu_logits = upload(*cpu_, {num_rows, vocab}, logits);
      cpu_->sample_rows(cpu_logits, rows, want);
      Tensor gpu_logits = upload(*gpu_, {num_rows, vocab}, logits);
      for (int launch = 0; launch < 2; ++launch) {
        gpu_->sample_rows(gpu_logits, rows, got);
        ASSERT_EQ(got.size(), want.size());
        for (int r = 0; r < num_rows; ++r) EXPECT_EQ(got[r], want[r]) << "row " << r << ", launch " << launch;
      }
      EXPECT_EQ(want[0], vocab - 1);  // the cases above are what the reference sees
      if (num_rows > 3) {
        EXPECT_EQ(want[1], vocab / 3);
        EXPECT_EQ(want[3], 0);
      }
    }
  }
}

// More rows than a grid's y dimension holds (65,535), each a block's whole row.
TEST_F(CudaSamplingTest, GreedyChoiceOfManyRows) {
  constexpr int kRows = 70000, kVocab = 12;
  const auto logits = random_values(static_cast<size_t>(kRows) * kVocab, 5, 3.0f);
  std::vector<RowSampling> rows(kRows);  // greedy
  std::vector<int32_t> want, got;
  Tensor cpu_logits = upload(*cpu_, {kRows, kVocab}, logits);
  cpu_->sample_rows(cpu_logits, rows, want);
  Tensor gpu_logits = upload(*gpu_, {kRows, kVocab}, logits);
  gpu_->sample_rows(gpu_logits, rows, got);
  ASSERT_EQ(got.size(), want.size());
  int mismatches = 0;
  for (int r = 0; r < kRows; ++r) mismatches += got[r] != want[r];
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(got.back(), want.back());
}

// Penalties on chosen logits, V2's vocabulary: the same values as the CPU's, the rest untouched.
TEST_F(CudaSamplingTest, PenalisedLogitsMatchTheReference) {
  constexpr int kRows = 5, kVocab = 102400;
  const auto logits = random_values(static_cast<size_t>(kRows) * kVocab, 9, 3.0f);
  std::vector<LogitPenalty> penalties;
  std::mt19937 rng(9);
  for (int r = 0; r < kRows; ++r)
    for (int i = 0; i < 300 * r; ++i)  // row 0 has none; distinct tokens in each row
      penalties.push_back({r, static_cast<TokenId>((i * 337 + r) % kVocab), 1.0f + 0.1f * (rng() % 8),
                           0.25f * static_cast<float>(rng() % 9) - 1.0f});
  Tensor cpu_logits = upload(*cpu_, {kRows, kVocab}, logits);
  Tensor gpu_logits = upload(*gpu_, {kRows, kVocab}, logits);
  cpu_->penalise_logits(cpu_logits, penalties);
  gpu_->penalise_logits(gpu_logits, penalties);
  std::vector<float> want(logits.size()), got(logits.size());
  cpu_->to_host(cpu_logits, want.data());
  gpu_->to_host(gpu_logits, got.data());
  int changed = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "logit " << i;
    changed += want[i] != logits[i];
  }
  EXPECT_GT(changed, 2500);
}

// penalise_logits has read its penalties when it returns, whatever the stream still has to run:
// several calls in a row, each over its own logits, with more changes than the one before and its
// caller's vector overwritten as soon as it returns, give each tensor the CPU's changes.
TEST_F(CudaSamplingTest, PenaltiesOfCallsInARowReachTheirOwnLogits) {
  constexpr int kRows = 3, kVocab = 5003, kCalls = 5;
  std::vector<std::vector<float>> logits;
  std::vector<Tensor> cpu_logits, gpu_logits;
  std::vector<LogitPenalty> penalties;
  for (int call = 0; call < kCalls; ++call) {
    logits.push_back(random_values(static_cast<size_t>(kRows) * kVocab, 20 + call, 3.0f));
    cpu_logits.push_back(upload(*cpu_, {kRows, kVocab}, logits.back()));
    gpu_logits.push_back(upload(*gpu_, {kRows, kVocab}, logits.back()));
    penalties.clear();
    for (int r = 0; r < kRows; ++r)
      for (int i = 0; i < 2000 * (call + 1) / kRows; ++i)
        penalties.push_back({r, static_cast<TokenId>((i * 7 + call * 13 + r) % kVocab), 1.0f + 0.1f * (call + 1),
                             0.5f * static_cast<float>(call - r)});
    cpu_->penalise_logits(cpu_logits.back(), penalties);
    gpu_->penalise_logits(gpu_logits.back(), penalties);
    for (LogitPenalty& p : penalties) p = {0, 0, 100.0f, 1000.0f};  // what a late copy would read
  }
  for (int call = 0; call < kCalls; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    std::vector<float> want(logits[call].size()), got(logits[call].size());
    cpu_->to_host(cpu_logits[call], want.data());
    gpu_->to_host(gpu_logits[call], got.data());
    int changed = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "logit " << i;
      changed += want[i] != logits[call][i];
    }
    EXPECT_GT(changed, 1000);
  }
}

TEST_F(CudaSamplingTest, RowsMatchTheReferenceChoice) {
  run_case(60, 5003, 1);
  run_case(20, 102400, 2);
}

}  // namespace
}  // namespace dsinfer
