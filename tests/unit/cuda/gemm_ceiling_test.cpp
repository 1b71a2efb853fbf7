// The GEMM ceilings the benchmarks divide by: the best of short groups and the rate sustained
// over a window. A window's rate is an average over every product in it, so it cannot beat the
// best group by more than the timing noise, and it counts the products it timed: a miscount
// shows as a rate far from the best group's.
#include <gtest/gtest.h>

#include "backend/backend.h"

namespace dsinfer {
namespace {

TEST(GemmCeilingTest, TheSustainedRateIsNearTheBestGroupsAndNotAbove) {
  if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
  for (const bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "block-scaled FP8" : "bf16");
    const double best = measure_device_gemm_flops("cuda", fp8);
    const double sustained = measure_device_gemm_flops("cuda", fp8, 0.1);
    if (fp8 && best == 0) GTEST_SKIP() << "cuBLASLt has no block-scaled FP8 product here";
    ASSERT_GT(best, 1e12);
    EXPECT_LT(sustained, 1.05 * best);
    EXPECT_GT(sustained, 0.5 * best);
  }
}

}  // namespace
}  // namespace dsinfer
