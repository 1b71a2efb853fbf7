// tools/ncu_step_kernels.py, which cuts Nsight Compute's per-launch table into forward steps
// (each ending with the greedy choice) and lists one step's kernels: in launch order, or by
// total time, with times converted from the table's unit and ncu's own lines skipped.
#include <gtest/gtest.h>

#include <string>

#include "run_binary.h"

namespace dsinfer {
namespace {

using testing::run_tool;

const std::string kSample = std::string(DSINFER_SOURCE_DIR) + "/tests/data/ncu_raw_sample.csv";

std::string tool(const std::string& args) {
  const auto r = run_tool("ncu_step_kernels.py", kSample + " " + args);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return r.out;
}

TEST(NcuStepKernelsTest, LastStepInLaunchOrder) {
  const std::string out = tool("");
  // Steps end at each argmax: the prefill (3 launches), two decode steps; the trailing
  // embedding launch starts a step that never ends and is dropped.
  EXPECT_NE(out.find("step 2 of 3: 5 launches, 635.0 us"), std::string::npos) << out;
  EXPECT_NE(out.find("230.0 us  dsinfer::decode_tiles_kernel  (1, 264, 1)x(256, 1, 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("245.0 us  dsinfer::cuda::expert_gemm_kernel<4>  (22, 88, 1)x(128, 1, 1)"), std::string::npos)
      << out;
  EXPECT_LT(out.find("gather_rows_kernel"), out.find("decode_tiles_kernel")) << out;
  EXPECT_LT(out.find("(22, 88, 1)"), out.find("(16, 88, 1)")) << out;
  EXPECT_EQ(out.find("nvjet"), std::string::npos) << "the prefill's launches are not part of the step\n" << out;
}

TEST(NcuStepKernelsTest, StepChosenByIndexAndSummedPerKernel) {
  const std::string out = tool("--step -2 --summary");
  EXPECT_NE(out.find("step 1 of 3: 5 launches, 627.0 us"), std::string::npos) << out;
  EXPECT_NE(out.find("364.0 us    2 calls  dsinfer::cuda::expert_gemm_kernel<4>"), std::string::npos) << out;
  EXPECT_LT(out.find("expert_gemm_kernel"), out.find("decode_tiles_kernel")) << "longest first\n" << out;
  const std::string prefill = tool("--step 0");
  EXPECT_NE(prefill.find("step 0 of 3: 3 launches, 1267.4 us"), std::string::npos) << prefill;
  EXPECT_NE(prefill.find("1250.0 us  nvjet_sm90_tst_256x152"), std::string::npos) << prefill;
}

TEST(NcuStepKernelsTest, SaysWhatIsMissing) {
  const auto beyond = run_tool("ncu_step_kernels.py", kSample + " --step 3");
  EXPECT_NE(beyond.exit_code, 0);
  EXPECT_NE(beyond.out.find("step 3 asked for, 3 steps found"), std::string::npos) << beyond.out;
  const auto no_end = run_tool("ncu_step_kernels.py", kSample + " --step-end no_such_kernel");
  EXPECT_NE(no_end.exit_code, 0);
  EXPECT_NE(no_end.out.find("no kernel named like 'no_such_kernel' ends a step"), std::string::npos) << no_end.out;
  const auto not_ncu = run_tool("ncu_step_kernels.py", std::string(DSINFER_SOURCE_DIR) + "/README.md");
  EXPECT_NE(not_ncu.exit_code, 0);
  EXPECT_NE(not_ncu.out.find("no launch table found"), std::string::npos) << not_ncu.out;
}

}  // namespace
}  // namespace dsinfer
