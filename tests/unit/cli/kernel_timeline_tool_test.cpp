// tools/kernel_timeline.py, which sums up a kernel timeline (DSINFER_KERNEL_TIMELINE): each
// main-stream kernel's share of the step, from its wait returning to the next one's; side-stream
// kernels and the kernels that ran after the replay left out; names without their namespaces
// and parameters; with --stages, a layer's kernels with their median times over the layers.
// Where a kernel notes when its first block is done, --stages gives that block's own time too.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "run_binary.h"

namespace dsinfer {
namespace {

using testing::run_tool;

const std::string kSample = std::string(DSINFER_SOURCE_DIR) + "/tests/data/kernel_timeline_sample.tsv";
// Three repeats of a three-kernel layer between an embedding gather and a final norm and head,
// with a side-stream kernel inside the second repeat.
const std::string kLayers = std::string(DSINFER_SOURCE_DIR) + "/tests/data/kernel_timeline_layers.tsv";

std::string tool(const std::string& args, const std::string& timeline = kSample) {
  const auto r = run_tool("kernel_timeline.py", timeline + " " + args);
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

TEST(KernelTimelineToolTest, StagesListALayersKernelsWithTheirMedianTimes) {
  const std::string out = tool("--stages", kLayers);
  EXPECT_NE(out.find("repeating run: 3 kernels, 3 repeats (first at main-stream kernel #1)"), std::string::npos)
      << out;
  // Each position's times over the repeats: norm 1, 2, 1; first product 2, 2, 3; second 5, 4, 6.
  for (const char* line : {"  0 rms_norm_registers_kernel<true>", "  1 few_row_gemm_kernel<1, false>",
                           "  2 few_row_gemm_kernel<1, false>", "    (sum)"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << " in\n" << out;
  }
  std::istringstream lines(out.substr(out.find("repeating run")));
  std::vector<std::string> medians;
  for (std::string line; std::getline(lines, line);) {
    if (line.size() < 4 || line.find("median") != std::string::npos || line.rfind("repeating", 0) == 0) continue;
    medians.push_back(line.substr(line.find_last_of(' ') + 1));
  }
  EXPECT_EQ(medians, (std::vector<std::string>{"1.00", "2.00", "5.00", "8.00"})) << out;
  EXPECT_NE(out.find("384x1x1"), std::string::npos);
  EXPECT_LT(out.find("384x1x1", out.find("repeating run")), out.find("88x6x1", out.find("repeating run")));
}

TEST(KernelTimelineToolTest, StagesGiveTheFirstBlocksOwnTimeWhereAKernelNotesIt) {
  // kLayers with first_block_done_us: the 384-block product's first block done 1.0, 1.5 and
  // 1.0 us after its wait in the three repeats, the other kernels '-'.
  const std::string out =
      tool("--stages", std::string(DSINFER_SOURCE_DIR) + "/tests/data/kernel_timeline_first_block.tsv");
  EXPECT_NE(out.find("    (sum)                                                                            8.00"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("first block of #1 done 1.00 us after its wait (median of 3)"), std::string::npos) << out;
  EXPECT_EQ(out.find("first block of #0"), std::string::npos) << out;
  EXPECT_EQ(out.find("first block of #2"), std::string::npos) << out;
  // Timelines without the column list no such line.
  EXPECT_EQ(tool("--stages", kLayers).find("first block of"), std::string::npos);
}

TEST(KernelTimelineToolTest, StagesSayWhenNothingRepeats) {
  EXPECT_NE(tool("--stages").find("no repeating run of kernels"), std::string::npos);
}

}  // namespace
}  // namespace dsinfer
