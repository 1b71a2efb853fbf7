// The engine's device memory on the CUDA backend: a KV cache sized to a share of the device
// takes what that share leaves (kv_cache_sizing.h); a step out of memory while it is recorded as
// a CUDA graph runs eagerly instead, and one out of memory in an eager run fails its request
// while the engine serves on, a request decoding beside it included.
#include <gtest/gtest.h>

#include <cstdlib>

#include "backend/backend.h"
#include "backend/latent_cache_format.h"
#include "cuda_test_util.h"
#include "core/fault_injection.h"
#include "engine/engine_core.h"
#include "engine_outputs.h"

namespace dsinfer {
namespace {

GenerationRequest greedy(int max_tokens) {
  GenerationRequest r;
  for (int i = 0; i < 40; ++i) r.prompt_ids.push_back(3 + (i * 37) % 500);
  r.sampling.temperature = 0.0f;
  r.sampling.ignore_eos = true;
  r.sampling.max_tokens = max_tokens;
  return r;
}

class CudaEngineMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

// Two shares 10 GiB apart give caches 10 GiB apart (within 1% of the device: the runtime's own
// allocations move between engines), and the larger cache serves the tokens a small one does.
TEST_F(CudaEngineMemory, KvCacheTakesWhatTheShareLeaves) {
  const int64_t total = make_backend("cuda")->device_memory().value().total_bytes;
  constexpr int64_t kGiB = int64_t{1} << 30;
  ASSERT_GT(total, 24 * kGiB) << "the test sizes caches of 10 and 20 GiB";
  std::vector<TokenId> small_cache_tokens;
  {
    EngineCore core(testing_cuda::tiny_v3_cuda_config());
    ASSERT_TRUE(core.add_request(1, greedy(12)).ok());
    small_cache_tokens = testing::run_to_end(core).at(1).tokens;
  }
  int64_t cache_bytes[2] = {};
  for (int i = 0; i < 2; ++i) {
    EngineConfig c = testing_cuda::tiny_v3_cuda_config();
    c.device_memory_fraction = static_cast<double>((i + 1) * 10 * kGiB) / static_cast<double>(total);
    EngineCore core(c);
    const ModelConfig& m = core.model_config();
    const int64_t block_bytes = int64_t{core.config().block_size_tokens} * m.num_hidden_layers *
                                latent_entry_bytes(KvCacheFormat::kF32, m.kv_lora_rank, m.qk_rope_head_dim);
    cache_bytes[i] = static_cast<int64_t>(core.stats().num_kv_blocks_total) * block_bytes;
    ASSERT_TRUE(core.add_request(1, greedy(12)).ok());
    EXPECT_EQ(testing::run_to_end(core).at(1).tokens, small_cache_tokens);
  }
  EXPECT_NEAR(static_cast<double>(cache_bytes[1] - cache_bytes[0]), static_cast<double>(10 * kGiB), 0.01 * total);
  EXPECT_GT(cache_bytes[0], 9 * kGiB) << "a tiny model's weights and steps take little of 10 GiB";
}

// A share smaller than what the weights and a step already use is refused with a clear error.
TEST_F(CudaEngineMemory, AShareTooSmallForTheWeightsIsRefused) {
  EngineConfig c = testing_cuda::tiny_v3_cuda_config();
  c.device_memory_fraction = 1e-6;
  try {
    EngineCore core(c);
    FAIL() << "an engine was made with no memory for its KV cache";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kResourceExhausted);
    EXPECT_NE(std::string(e.what()).find("--gpu-memory-utilization"), std::string::npos) << e.what();
  }
}

// A one-token decode step is run eagerly twice, then recorded: the fourth pass through the
// layers is that recording. Out of memory there, the backend must close the capture it leaves
// open, and the step runs eagerly instead (as its bucket does from then on): the request gets
// the tokens of an engine that never failed. Out of memory in an eager step (the second pass)
// ends that step's request; a later one gets those tokens too.
TEST_F(CudaEngineMemory, OutOfMemoryWhileRecordingRunsTheStepEagerlyAndInAnEagerStepFailsItsRequest) {
  std::vector<TokenId> expected;
  {
    EngineCore core(testing_cuda::tiny_v3_cuda_config());
    ASSERT_TRUE(core.add_request(1, greedy(10)).ok());
    expected = testing::run_to_end(core).at(1).tokens;
  }
  ASSERT_EQ(expected.size(), 10u);
  {
    EngineCore core(testing_cuda::tiny_v3_cuda_config());
    ASSERT_TRUE(core.add_request(1, greedy(10)).ok());
    set_injected_faults("forward:4");
    const auto results = testing::run_to_end(core);
    set_injected_faults("");
    EXPECT_EQ(results.at(1).finish, FinishReason::kLength);
    EXPECT_EQ(results.at(1).tokens, expected);
    EXPECT_EQ(core.stats().num_failed_steps, 0);
  }
  EngineCore core(testing_cuda::tiny_v3_cuda_config());
  ASSERT_TRUE(core.add_request(1, greedy(10)).ok());
  set_injected_faults("forward:2");
  auto first = testing::run_to_end(core);
  set_injected_faults("");
  EXPECT_EQ(first.at(1).finish, FinishReason::kError);
  EXPECT_NE(first.at(1).error.message().find("injected fault at forward"), std::string::npos);
  EXPECT_EQ(core.stats().num_failed_steps, 1);

  ASSERT_TRUE(core.add_request(2, greedy(10)).ok());
  const auto second = testing::run_to_end(core);
  EXPECT_EQ(second.at(2).finish, FinishReason::kLength);
  EXPECT_EQ(second.at(2).tokens, expected);
}

// A request decoding (one step ahead, recorded steps) when another's prompt joins it in a step
// that runs out of memory: the newcomer ends with the error, the decoding one runs on with the
// tokens it gets alone (batch-invariant mode, so that the newcomer's steps beside it change
// nothing).
TEST_F(CudaEngineMemory, ARequestDecodingBesideAFailedPromptRunsOn) {
  setenv("DSINFER_BATCH_INVARIANT", "1", 1);  // read when the backend is made
  EngineConfig config = testing_cuda::tiny_v3_cuda_config();
  config.async_scheduling = true;
  std::vector<TokenId> expected;
  {
    EngineCore core(config);
    ASSERT_TRUE(core.add_request(1, greedy(16)).ok());
    expected = testing::run_to_end(core).at(1).tokens;
  }
  EngineCore core(config);
  unsetenv("DSINFER_BATCH_INVARIANT");
  ASSERT_TRUE(core.add_request(1, greedy(16)).ok());
  testing::Outputs results;
  // Its prompt, eager decode steps, a recording, replays.
  for (int i = 0; i < 6; ++i) testing::add_outputs(results, core.step());
  GenerationRequest newcomer = greedy(4);
  newcomer.prompt_ids.resize(30);
  ASSERT_TRUE(core.add_request(2, newcomer).ok());
  set_injected_faults("forward:1");  // the step holding the newcomer's prompt
  for (int i = 0; i < 3; ++i) testing::add_outputs(results, core.step());
  set_injected_faults("");
  testing::run_to_end(core, results);
  EXPECT_EQ(results.at(2).finish, FinishReason::kError);
  EXPECT_EQ(results.at(1).finish, FinishReason::kLength);
  EXPECT_EQ(results.at(1).tokens, expected);
  EXPECT_EQ(core.stats().num_failed_steps, 1);
}

}  // namespace
}  // namespace dsinfer
