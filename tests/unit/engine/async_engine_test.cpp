#include "engine/async_engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "test_fixtures.h"

namespace dsinfer {
namespace {

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<RequestOutput> outputs;
  bool finished = false;
  EngineClient::OutputCallback callback() {
    return [this](const RequestOutput& o) {
      std::lock_guard<std::mutex> lock(mu);
      outputs.push_back(o);
      if (o.finished()) finished = true;
      cv.notify_all();
    };
  }
  bool wait_finished(std::chrono::seconds timeout = std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return finished; });
  }
  size_t num_tokens() {
    std::lock_guard<std::mutex> lock(mu);
    size_t n = 0;
    for (auto& o : outputs) n += o.new_token_ids.size();
    return n;
  }
};

GenerationRequest long_request(int max_tokens) {
  GenerationRequest r;
  r.prompt_ids = std::vector<TokenId>(100, 9);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

TEST(AsyncEngine, StreamsAndFinishes) {
  AsyncEngine engine(testing::fixture_engine_config("tiny_v3"));
  Collector c;
  auto id = engine.submit(long_request(12), c.callback());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(c.wait_finished());
  EXPECT_EQ(c.num_tokens(), 12u);
  EXPECT_EQ(c.outputs.back().finish_reason, FinishReason::kLength);
}

TEST(AsyncEngine, CancelReturnsBlocks) {
  AsyncEngine engine(testing::fixture_engine_config("tiny_v3"));
  Collector c;
  auto id = engine.submit(long_request(150), c.callback());
  ASSERT_TRUE(id.ok());
  while (c.num_tokens() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine.cancel(*id);
  ASSERT_TRUE(c.wait_finished());
  EXPECT_EQ(c.outputs.back().finish_reason, FinishReason::kCancelled);
  EXPECT_LT(c.num_tokens(), 150u);
  for (int i = 0; i < 1000 && engine.stats().num_kv_blocks_used != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(engine.stats().num_kv_blocks_used, 0);
}

TEST(AsyncEngine, RejectsWhatCannotRun) {
  EngineConfig config = testing::fixture_engine_config("tiny_v3");
  AsyncEngine engine(config);
  Collector c;
  EXPECT_EQ(engine.submit(long_request(200), c.callback()).status().code(), StatusCode::kOutOfRange);
  GenerationRequest bad = long_request(4);
  bad.prompt_ids.push_back(100000);
  auto id = engine.submit(bad, c.callback());  // caught by the engine: an error output
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(c.wait_finished());
  EXPECT_EQ(c.outputs.back().finish_reason, FinishReason::kError);
  engine.stop_accepting();
  EXPECT_EQ(engine.submit(long_request(4), c.callback()).status().code(), StatusCode::kUnavailable);
}

TEST(AsyncEngine, ShutdownCancelsRunningRequests) {
  Collector c;
  {
    AsyncEngine engine(testing::fixture_engine_config("tiny_v3"));
    ASSERT_TRUE(engine.submit(long_request(150), c.callback()).ok());
    while (c.num_tokens() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(c.finished);
  EXPECT_EQ(c.outputs.back().finish_reason, FinishReason::kCancelled);
}


// The server's engine thread with one-step-ahead scheduling: a request streams to its length,
// and a cancelled one, possibly in a step in flight, ends cancelled and returns its blocks.
TEST(AsyncEngine, StreamsAndCancelsWithAsynchronousScheduling) {
  EngineConfig config = testing::fixture_engine_config("tiny_v3");
  config.async_scheduling = true;
  AsyncEngine engine(config);
  Collector done, cancelled;
  ASSERT_TRUE(engine.submit(long_request(12), done.callback()).ok());
  auto id = engine.submit(long_request(150), cancelled.callback());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(done.wait_finished());
  EXPECT_EQ(done.num_tokens(), 12u);
  EXPECT_EQ(done.outputs.back().finish_reason, FinishReason::kLength);
  engine.cancel(*id);
  ASSERT_TRUE(cancelled.wait_finished());
  EXPECT_EQ(cancelled.outputs.back().finish_reason, FinishReason::kCancelled);
  for (int i = 0; i < 1000 && engine.stats().num_kv_blocks_used != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(engine.stats().num_kv_blocks_used, 0);
}

}  // namespace
}  // namespace dsinfer
