// The engine on the CPU backend under pressure (tests/support/engine_pressure.h): preempted,
// chunked, prefix-sharing and tier-restored requests give the tokens they give alone, with the
// fp32 latent cache and with the FP8 one.
#include <gtest/gtest.h>

#include "engine_pressure.h"
#include "test_fixtures.h"

namespace dsinfer {
namespace {

TEST(EnginePressure, RequestsGiveTheirTokensAlone) {
  test_support::expect_pressure_gives_tokens_alone(testing::fixture_engine_config("tiny_v3"), 384);
}

TEST(EnginePressure, RequestsGiveTheirTokensAloneWithTheFp8Cache) {
  EngineConfig c = testing::fixture_engine_config("tiny_v3");
  c.kv_cache_format = KvCacheFormat::kFp8;
  test_support::expect_pressure_gives_tokens_alone(c, 384);
}

}  // namespace
}  // namespace dsinfer
