// A recorded decode step holds the addresses of the caches it was recorded over, every layer's:
// a step over other caches must not replay it. Here the backend records by noting which layer
// caches the attention of a recorded step touched, and a replay reports those: every replay must
// have been recorded over the very caches of the step that replays it.
#include <gtest/gtest.h>

#include <map>
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

}  // namespace
}  // namespace dsinfer
