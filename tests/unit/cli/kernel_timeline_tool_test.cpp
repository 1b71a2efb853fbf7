// tools/kernel_timeline.py, which sums up a kernel timeline (DSINFER_KERNEL_TIMELINE): each
// main-stream kernel's share of the step, from its wait returning to the next one's; side-stream
// kernels and the kernels that ran after the replay left out; names without their namespaces
// and parameters.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "run_binary.h"

namespace dsinfer {
namespace {

using testing::run_tool;

const std::string kSample = std::string(DSINFER_SOURCE_DIR) + "/tests/data/kernel_timeline_sample.tsv";

std::string tool(const std::string& args) {
  const auto r = run_tool("kernel_timeline.py", kSample + " " + args);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return r.out;
}

// The numbers after the kernel's column (60 characters) of the line that starts with `kernel`.
std::vector<std::string> row(const std::string& out, const std::string& kernel) {
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(kernel, 0) != 0 || line.size() <= 60) continue;
    std::istringstream fields(line.substr(60));
    std::vector<std::string> values;
    for (std::string v; fields >> v;) values.push_back(v);
    return values;
  }
  ADD_FAILURE() << "no row for " << kernel << " in\n" << out;
  return {};
}

TEST(KernelTimelineToolTest, SharesRunFromOneWaitToTheNextOnTheMainStream) {
  const std::string out = tool("");
  // Main-stream waits return at 1, 2, 5, 15, 16 and 18 us; the side kernel and the kernel
  // after the replay are not in the span.
  EXPECT_NE(out.find("7 kernels (1 on the side stream); first to last wait returning: 17.0 us"), std::string::npos)
      << out;
  // count, total, share, median, median lead
  EXPECT_EQ(row(out, "route_plan_kernel "), (std::vector<std::string>{"1", "10.0", "58.8%", "10.00", "1.00"}));
  EXPECT_EQ(row(out, "few_row_gemm_kernel<1, false> "),
            (std::vector<std::string>{"2", "4.0", "23.5%", "2.00", "5.25"}));
  EXPECT_EQ(row(out, "rms_norm_registers_kernel<true> "),
            (std::vector<std::string>{"2", "3.0", "17.6%", "1.50", "1.50"}));
  EXPECT_LT(out.find("route_plan_kernel"), out.find("few_row_gemm_kernel")) << "longest first";
  EXPECT_NE(out.find("median 2.00 us; 0 of 5 under 0.5 us"), std::string::npos) << out;
}

TEST(KernelTimelineToolTest, ByGridTellsTheSameKernelsLaunchesApart) {
  const std::string out = tool("--by-grid");
  EXPECT_EQ(row(out, "few_row_gemm_kernel<1, false> [384x1x1]"),
            (std::vector<std::string>{"1", "3.0", "17.6%", "3.00", "0.50"}));
  EXPECT_EQ(row(out, "few_row_gemm_kernel<1, false> [88x6x1]"),
            (std::vector<std::string>{"1", "1.0", "5.9%", "1.00", "10.00"}));
}

TEST(KernelTimelineToolTest, SequenceListsKernelsInOrderWithTheirStream) {
  const std::string out = tool("--sequence 3");
  const size_t first = out.find("   0 main        0.00      1.00 1x1x1          rms_norm_registers_kernel<true>");
  const size_t side = out.find("   2 side        2.50      3.00 470x1x1        few_row_gemm_kernel<1, false>");
  EXPECT_NE(first, std::string::npos) << out;
  EXPECT_NE(side, std::string::npos) << out;
  EXPECT_EQ(out.find("   3 main"), std::string::npos) << "three kernels listed";
}

}  // namespace
}  // namespace dsinfer
