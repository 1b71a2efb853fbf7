// The GPU clock sampler of the benchmarks: where a CUDA device is visible, NVML loads and the
// samples read real clocks; elsewhere it says why not and measures nothing, without failing.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "backend/backend.h"
#include "backend/device_clocks.h"

namespace dsinfer {
namespace {

TEST(DeviceClockSamplerTest, SamplesWhereADriverIsAndSaysWhyNotElsewhere) {
  DeviceClockSampler sampler(0, std::chrono::microseconds(1000));
  if (cuda_backend_available()) {
    ASSERT_TRUE(sampler.available()) << "a CUDA device is visible, but: " << sampler.unavailable_reason();
  }
  EXPECT_EQ(sampler.stop().num_samples, 0) << "stopped before it started";
  sampler.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  const DeviceClockSummary summary = sampler.stop();
  if (!sampler.available()) {
    EXPECT_FALSE(sampler.unavailable_reason().empty());
    EXPECT_EQ(summary.num_samples, 0);
    EXPECT_EQ(summary.describe(), "no samples");
    return;
  }
  EXPECT_GE(summary.num_samples, 5) << "40 ms at one sample a millisecond";
  EXPECT_GT(summary.min_sm_mhz, 0u);
  EXPECT_LE(summary.min_sm_mhz, summary.mean_sm_mhz);
  EXPECT_LE(summary.mean_sm_mhz, summary.max_sm_mhz);
  EXPECT_GE(summary.power_capped_share, 0.0);
  EXPECT_LE(summary.power_capped_share, 1.0);
  EXPECT_EQ(sampler.stop().num_samples, 0) << "a second stop has nothing new";
  // Started again, it samples afresh.
  sampler.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GT(sampler.stop().num_samples, 0);
}

}  // namespace
}  // namespace dsinfer
