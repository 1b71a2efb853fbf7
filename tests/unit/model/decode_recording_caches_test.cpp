// A recorded decode step holds the addresses of the caches it was recorded over, every layer's:
// a step over other caches must not replay it. Here the backend records by noting which layer
// caches the attention of a recorded step touched, and a replay reports those: every replay must
// have been recorded over the very caches of the step that replays it. And a step the backend
// gives another form (Backend::recording_variant) must not replay the recording of a step of the
// same size in the first form.
#include <gtest/gtest.h>

#include <map>
#include <utility>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "forward_batch_util.h"
#include "model/deepseek_model.h"
#include "model/deepseek_weights.h"
#include "model/model_config.h"

namespace dsinfer {
namespace {

class NotingRecorderBackend : public CpuBackend {
 public:
  bool can_record() const override { return true; }
  void begin_recording(uint64_t key) override {
    recording_key_ = key;
    recorded_[key].clear();
    recording_ = true;
  }
  bool end_recording(uint64_t) override {
    recording_ = false;
    return true;
  }
  bool replay(uint64_t key) override {
    replayed.push_back(recorded_.at(key));
    return true;
  }
  void mla_attention(const MlaAttentionArgs& args) override {
    if (recording_) recorded_[recording_key_].push_back(args.cache->data.data);
    CpuBackend::mla_attention(args);
  }
  std::vector<std::vector<const void*>> replayed;  // per replay: the layer caches it was recorded over

 private:
  bool recording_ = false;
  uint64_t recording_key_ = 0;
  std::map<uint64_t, std::vector<const void*>> recorded_;
};

constexpr int kBlockSize = 64;

std::vector<const void*> addresses_of(const KvCaches& caches) {
  std::vector<const void*> out;
  for (const LayerKvCache& layer : caches.layers) out.push_back(layer.data.data);
  return out;
}

ForwardBatch one_token(int position, int vocab) {
  ForwardBatch b;
  testing::append_sequence(b, {0, 1}, position, 1, [&](int p) { return (p * 7 + 3) % vocab; }, kBlockSize);
  return b;
}

TEST(DecodeRecordingCaches, StepsOverOtherCachesNeverReplayTheOldRecording) {
  const ModelConfig config = ModelConfig::load(std::string(DSINFER_SOURCE_DIR) + "/tests/data/tiny_v3");
  NotingRecorderBackend backend;
  DeepseekModel model(config, make_random_weights(config, backend, 5), backend, 256);
  KvCaches first = model.allocate_caches(2, kBlockSize);
  // The second set shares the first layer's cache and has its own for the others: a recording
  // keyed by the first layer's address alone would be replayed over the first set's others.
  KvCaches second = model.allocate_caches(2, kBlockSize);
  ASSERT_GE(second.layers.size(), 2u);
  second.layers[0] = first.layers[0];

  for (KvCaches* caches : {&first, &second, &first}) {
    const size_t replays_before = backend.replayed.size();
    for (int position = 0; position < 6; ++position) model.forward(one_token(position, config.vocab_size), *caches);
    ASSERT_GT(backend.replayed.size(), replays_before) << "six steps of one bucket: recorded and replayed";
    for (size_t r = replays_before; r < backend.replayed.size(); ++r)
      EXPECT_EQ(backend.replayed[r], addresses_of(*caches)) << "replay " << r;
  }
}

// Steps whose context reaches kLongContext positions take a second form, as the CUDA backend's
// long contexts do: a replay must be of a recording made in the form of the step replaying it.
class TwoFormRecorderBackend : public CpuBackend {
 public:
  static constexpr int kLongContext = 5;
  bool can_record() const override { return true; }
  uint32_t recording_variant(const ForwardBatch& batch) const override { return form_of(batch); }
  void begin_step(const ForwardBatch& batch) override { step_form_ = form_of(batch); }
  void begin_recording(uint64_t key) override { recorded_form_[key] = step_form_; }
  bool end_recording(uint64_t) override { return true; }
  bool replay(uint64_t key) override {
    replays.push_back({recorded_form_.at(key), step_form_});
    return true;
  }
  std::vector<std::pair<uint32_t, uint32_t>> replays;  // per replay: the recording's form, the step's

 private:
  static uint32_t form_of(const ForwardBatch& batch) {
    for (int32_t len : batch.context_lens)
      if (len >= kLongContext) return 1;
    return 0;
  }
  uint32_t step_form_ = 0;
  std::map<uint64_t, uint32_t> recorded_form_;
};

TEST(DecodeRecordingCaches, StepsOfAnotherFormNeverReplayTheFirstFormsRecording) {
  const ModelConfig config = ModelConfig::load(std::string(DSINFER_SOURCE_DIR) + "/tests/data/tiny_v3");
  TwoFormRecorderBackend backend;
  DeepseekModel model(config, make_random_weights(config, backend, 5), backend, 256);
  KvCaches caches = model.allocate_caches(2, kBlockSize);
  // Contexts of 1 to 12 positions: each form's steps run eagerly twice, then are recorded and
  // replayed: the first form's at contexts 3 and 4, the second form's from context 7 on.
  for (int position = 0; position < 12; ++position) model.forward(one_token(position, config.vocab_size), caches);
  ASSERT_EQ(backend.replays.size(), 2u + 6u);
  EXPECT_EQ(model.num_replayed_steps(), 8);
  int num_second_form = 0;
  for (const auto& [recorded, stepped] : backend.replays) {
    EXPECT_EQ(recorded, stepped);
    num_second_form += stepped == 1;
  }
  EXPECT_EQ(num_second_form, 6);
}

}  // namespace
}  // namespace dsinfer
