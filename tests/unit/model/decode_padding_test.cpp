// Decode steps on a backend that records, or pads without recording, run as their batch
// bucket, with padding sequences added. Here the backend either claims to record but every
// recording fails, or does not record, so the model runs the padded batch eagerly: its real rows
// and the cache it leaves must match the plain batch's bit for bit (the CPU backend's
// arithmetic does not depend on the batch).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "forward_batch_util.h"
#include "model/deepseek_model.h"
#include "model/deepseek_weights.h"
#include "model/model_config.h"

namespace dsinfer {
namespace {

// Pads decode steps to their bucket; where it claims to record, every recording fails.
class PaddingBackend : public CpuBackend {
 public:
  explicit PaddingBackend(bool records) : records_(records) {}
  bool can_record() const override { return records_; }
  bool pads_decode_steps() const override { return true; }
  void begin_recording(uint64_t) override { ++num_begun; }
  bool end_recording(uint64_t) override { return false; }
  bool replay(uint64_t) override { return false; }
  void begin_step(const ForwardBatch& batch) override { step_sizes.push_back(batch.num_tokens); }
  int num_begun = 0;
  std::vector<int> step_sizes;

 private:
  bool records_;
};

constexpr int kBlockSize = 64;
constexpr int kPromptLengths[3] = {5, 70, 33};

// Sequence s owns blocks {2s + 1, 2s}.
std::vector<int32_t> table_of(int s) { return {2 * s + 1, 2 * s}; }

// The prompts before the decode steps, one forward over all three sequences.
ForwardBatch prefill_batch(int vocab) {
  ForwardBatch b;
  for (int s = 0; s < 3; ++s)
    testing::append_sequence(b, table_of(s), 0, kPromptLengths[s], [&](int p) { return (p * 5 + s) % vocab; },
                             kBlockSize);
  return b;
}

// Three sequences at different lengths, one new token each.
ForwardBatch decode_batch(int step, int vocab) {
  ForwardBatch b;
  for (int s = 0; s < 3; ++s)
    testing::append_sequence(b, table_of(s), kPromptLengths[s] + step, 1,
                             [&](int p) { return (p * 7 + s * 13) % vocab; }, kBlockSize);
  return b;
}

std::vector<float> host_copy(Backend& be, const Tensor& t) {
  std::vector<float> v(t.num_elements());
  be.to_host(t, v.data());
  return v;
}

// Three decode steps of three sequences on `padder` against the plain backend: the padded
// bucket's real rows and the cache it leaves match the plain batch's bit for bit.
void expect_padded_bucket_gives_plain_results(PaddingBackend& padder) {
  const ModelConfig config = ModelConfig::load(std::string(DSINFER_SOURCE_DIR) + "/tests/data/tiny_v3");
  CpuBackend plain;
  DeepseekModel plain_model(config, make_random_weights(config, plain, 5), plain, 256);
  DeepseekModel padded_model(config, make_random_weights(config, padder, 5), padder, 256);
  KvCaches plain_caches = plain_model.allocate_caches(8, kBlockSize);
  KvCaches padded_caches = padded_model.allocate_caches(8, kBlockSize);
  // Unused blocks hold a marker that a stray write of a padding token would overwrite.
  std::vector<float> marker(plain_caches.layers[0].data.num_elements());
  std::iota(marker.begin(), marker.end(), 0.5f);
  for (KvCaches* caches : {&plain_caches, &padded_caches})
    for (LayerKvCache& layer : caches->layers) std::copy(marker.begin(), marker.end(), layer.data.as<float>());

  const ForwardBatch prompts = prefill_batch(config.vocab_size);
  plain_model.forward(prompts, plain_caches);
  padded_model.forward(prompts, padded_caches);
  for (int step = 0; step < 3; ++step) {
    const ForwardBatch batch = decode_batch(step, config.vocab_size);
    const ForwardOutput a = plain_model.forward(batch, plain_caches);
    const ForwardOutput b = padded_model.forward(batch, padded_caches);
    ASSERT_EQ(b.logits.dim(0), 3) << "the caller sees its own rows only";
    EXPECT_EQ(host_copy(padder, b.logits), host_copy(plain, a.logits)) << "step " << step;
    EXPECT_EQ(host_copy(padder, b.hidden), host_copy(plain, a.hidden)) << "step " << step;
  }
  for (size_t l = 0; l < plain_caches.layers.size(); ++l)
    EXPECT_EQ(host_copy(padder, padded_caches.layers[l].data), host_copy(plain, plain_caches.layers[l].data))
        << "layer " << l;
  // The decode steps ran as the 4-sequence bucket.
  EXPECT_EQ(padder.step_sizes, (std::vector<int>{prompts.num_tokens, 4, 4, 4}));
}

TEST(DecodePadding, PaddedBucketGivesTheRowsAndCacheOfThePlainBatch) {
  PaddingBackend recorder(/*records=*/true);
  expect_padded_bucket_gives_plain_results(recorder);
  // The third step tried to record (after two eager runs of its bucket) and failed; none after
  // it tries again.
  EXPECT_EQ(recorder.num_begun, 1);
}

// A backend that pads without recording (DSINFER_CUDA_GRAPHS=padded on CUDA) runs every decode
// step padded and eagerly, and is never asked to record.
TEST(DecodePadding, PaddingWithoutRecordingNeverRecords) {
  PaddingBackend padder(/*records=*/false);
  expect_padded_bucket_gives_plain_results(padder);
  EXPECT_EQ(padder.num_begun, 0);
}

}  // namespace
}  // namespace dsinfer
