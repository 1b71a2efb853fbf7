// The engine on the CUDA backend under pressure (tests/support/engine_pressure.h): preempted
// requests computed again, prompts prefilled in chunks over cached prefixes, prefix hits on the
// device, restores from the host tier and the block store, one step scheduled ahead and decode
// steps replayed from recordings. In batch-invariant mode every request gives the tokens it
// gives alone, on each fixture and with either latent cache format. (The default mode has no
// such bar: its kernels depend on the batch, and a recorded step pads the batch to its bucket,
// so under pressure 3 of 10 seeded requests drew other tokens replayed than eager.)
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "cuda_test_util.h"
#include "engine_pressure.h"

namespace dsinfer {
namespace {

using testing_cuda::ScopedEnv;

// The fixtures' token ids: tiny_v2_lite has the smallest vocabulary.
constexpr int kVocab = 384;

EngineConfig roomy_config(const std::string& fixture, KvCacheFormat format) {
  EngineConfig c = testing_cuda::tiny_v3_cuda_config();
  c.model_dir = testing_cuda::source_dir() + "/tests/data/" + fixture;
  c.kv_cache_format = format;
  return c;
}

class CudaEnginePressureTest : public ::testing::TestWithParam<std::tuple<std::string, KvCacheFormat>> {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_P(CudaEnginePressureTest, BatchInvariantRequestsGiveTheirTokensAlone) {
  const auto& [fixture, format] = GetParam();
  ScopedEnv invariant("DSINFER_BATCH_INVARIANT", "1");
  test_support::expect_pressure_gives_tokens_alone(roomy_config(fixture, format), kVocab);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaEnginePressureTest,
                         ::testing::Combine(::testing::Values("tiny_v3", "tiny_v2_lite", "tiny_v3_fp8"),
                                            ::testing::Values(KvCacheFormat::kF32, KvCacheFormat::kFp8)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + kv_cache_format_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace dsinfer
