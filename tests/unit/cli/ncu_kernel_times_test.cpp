// tools/ncu_kernel_times.py, which turns Nsight Compute's per-kernel summary into the per-layer
// tables of bench/RESULTS.md: totals per kernel across time units, per marker kernel, and
// cuBLASLt's kernels lumped into one row.
#include <gtest/gtest.h>

#include <string>

#include "run_binary.h"

namespace dsinfer {
namespace {

using testing::run_tool;

const std::string kSample = std::string(DSINFER_SOURCE_DIR) + "/tests/data/ncu_per_kernel_sample.txt";

std::string tool(const std::string& args) {
  const auto r = run_tool("ncu_kernel_times.py", kSample + " " + args);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return r.out;
}

TEST(NcuKernelTimesTest, TotalsPerKernelAcrossUnits) {
  const std::string out = tool("");
  // 2 x 61 us + 2 x 0.25 ms + 4 x 300 us + 1 x 20,000 ns = 1,842 us.
  EXPECT_NE(out.find("1842.0 us, all kernels"), std::string::npos) << out;
  EXPECT_NE(out.find("1200.0 us     4.0 calls  nvjet_sm90_tss_256x128"), std::string::npos) << out;
  EXPECT_NE(out.find("500.0 us     2.0 calls  dsinfer::combine_kernel<float, 4>"), std::string::npos) << out;
  EXPECT_NE(out.find("122.0 us     2.0 calls  dsinfer::route_kernel"), std::string::npos) << out;
  EXPECT_NE(out.find("20.0 us     1.0 calls  nvjet_sm90_tss_128x168"), std::string::npos) << out;
  // Longest first.
  EXPECT_LT(out.find("nvjet_sm90_tss_256x128"), out.find("combine_kernel")) << out;
}

TEST(NcuKernelTimesTest, PerMarkerKernelWithLibraryKernelsInOneRow) {
  const std::string out = tool("--per route_kernel --group-library");
  EXPECT_NE(out.find("921.0 us per route_kernel, all kernels"), std::string::npos) << out;
  EXPECT_NE(out.find("610.0 us per route_kernel     2.5 calls  cuBLASLt products"), std::string::npos) << out;
  EXPECT_NE(out.find("61.0 us per route_kernel     1.0 calls  dsinfer::route_kernel"), std::string::npos) << out;
}

// Three kernels' summaries from a 4 x 4k FP8 prefill run with the DRAM byte metrics: each row
// adds the kernel's traffic (read + write, across byte units and thousands separators) and its
// rate over the kernel's time.
TEST(NcuKernelTimesTest, DramTrafficAndRateWhereMeasured) {
  const std::string sample = std::string(DSINFER_SOURCE_DIR) + "/tests/data/ncu_per_kernel_dram_sample.txt";
  const auto r = run_tool("ncu_kernel_times.py", sample + " --per route_kernel");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // combine: 169.04 us, 537.67 + 124.50 MB; route: 37.07 us, 4.25 MB + 192 bytes.
  EXPECT_NE(r.out.find("262.0 us per route_kernel, all kernels"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("169.0 us per route_kernel     1.0 calls     662.2 MB DRAM   3917 GB/s  "
                       "dsinfer::combine_kernel<__nv_bfloat16, 4>"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("37.1 us per route_kernel     1.0 calls       4.3 MB DRAM    115 GB/s  dsinfer::route_kernel"),
            std::string::npos)
      << r.out;
  // Without the metrics, rows keep their time-only form.
  EXPECT_EQ(tool("").find("MB DRAM"), std::string::npos);
}

TEST(NcuKernelTimesTest, SaysWhatIsMissing) {
  const auto no_marker = run_tool("ncu_kernel_times.py", kSample + " --per no_such_kernel");
  EXPECT_NE(no_marker.exit_code, 0);
  EXPECT_NE(no_marker.out.find("no kernel named like 'no_such_kernel'"), std::string::npos) << no_marker.out;
  const auto not_ncu = run_tool("ncu_kernel_times.py", std::string(DSINFER_SOURCE_DIR) + "/README.md");
  EXPECT_NE(not_ncu.exit_code, 0);
  EXPECT_NE(not_ncu.out.find("no kernel summaries found"), std::string::npos) << not_ncu.out;
}

}  // namespace
}  // namespace dsinfer
