// tools/ncu_stalls.py, which tables where a kernel's warps wait from Nsight Compute's
// per-instruction source counters: stall reasons, the instructions with the most samples, and
// per opcode the instructions executed and shared-memory wavefronts, and the code a launch runs.
// The sample holds a kernel whose block repeats (a second profiled launch) and two others, one of
// them with an instruction that no warp ran.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "run_binary.h"

namespace dsinfer {
namespace {

using testing::run_command;
using testing::run_tool;

const std::string kSample = std::string(DSINFER_SOURCE_DIR) + "/tests/data/ncu_source_sample.csv";

TEST(NcuStallsTest, TablesEachKernelOnceWithReasonsInstructionsAndOpcodes) {
  const auto r = run_tool("ncu_stalls.py", kSample);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // The repeated block is read once: 100 samples, not 200.
  EXPECT_NE(r.out.find("## void k_a(int)\n\n100 samples over 5 instructions; 1,900 warp instructions executed"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("## void k_a(int)"), r.out.rfind("## void k_a(int)")) << r.out;
  EXPECT_NE(r.out.find("| barrier | 55 | 55.0% |"), std::string::npos) << r.out;
  EXPECT_LT(r.out.find("| barrier | 55"), r.out.find("| wait | 25")) << r.out;  // largest first
  // Instructions by samples, at their offset in the kernel, with their two largest reasons.
  const size_t depbar = r.out.find("| 0x20 | 60 | 60.0% | `WARPGROUP.DEPBAR.LE gsb0, 0x0` | barrier 55, wait 5 |");
  const size_t qgmma = r.out.find("| 0x10 | 20 | 20.0% | `QGMMA.64x128x32.F32.E4M3.E4M3");
  ASSERT_NE(depbar, std::string::npos) << r.out;
  ASSERT_NE(qgmma, std::string::npos) << r.out;
  EXPECT_LT(depbar, qgmma);
  EXPECT_NE(r.out.find("| 0x30 | 15 | 15.0% | `@!P0 BRA 0x7f0000001000` | long_sb 12, branch_resolving 3 |"),
            std::string::npos)
      << r.out;
  // An instruction without samples is left out of that table, not of the opcodes'.
  EXPECT_EQ(r.out.find("`LDS R4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| LDS | 200 | 0 | 300 | 200 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| QGMMA | 400 | 20 | 4,800 | 4,800 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| BRA | 800 | 15 | 0 | 0 |"), std::string::npos) << r.out;  // guard not an opcode
  EXPECT_NE(r.out.find("## void k_b()\n\n10 samples over 2 instructions"), std::string::npos) << r.out;
}

TEST(NcuStallsTest, CountsTheCodeALaunchRanInInstructionsBytesAndLines) {
  const auto r = run_tool("ncu_stalls.py", kSample);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("1,900 warp instructions executed\n5 instructions run at least once (80 bytes of code; "
                       "128-byte lines: 1)"),
            std::string::npos)
      << r.out;
  // k_c's NOP, branched over, is not counted; its EXIT lies in a second line.
  EXPECT_NE(r.out.find("## void k_c()\n\n2 samples over 4 instructions; 96 warp instructions executed\n"
                       "3 instructions run at least once (48 bytes of code; 128-byte lines: 2)"),
            std::string::npos)
      << r.out;
}

TEST(NcuStallsTest, PicksKernelsByNameAndCutsTablesToTop) {
  const auto r = run_tool("ncu_stalls.py", kSample + " --kernel k_b --top 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find("k_a"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| 0x0 | 8 | 80.0% | `FFMA R1, R2, R3, R1` | selected 8 |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("`EXIT`"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("| EXIT |"), std::string::npos) << r.out;
}

TEST(NcuStallsTest, ReadsGzippedReports) {
  const std::string gz = ::testing::TempDir() + "ncu_source_sample.csv.gz";
  ASSERT_EQ(run_command("gzip -c " + kSample + " > " + gz).exit_code, 0);
  const auto r = run_tool("ncu_stalls.py", gz + " --kernel k_a");
  std::remove(gz.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("100 samples over 5 instructions"), std::string::npos) << r.out;
}

TEST(NcuStallsTest, AMissingFileOrKernelIsAnErrorNotATrace) {
  const auto missing = run_tool("ncu_stalls.py", "/nonexistent/stall.csv");
  EXPECT_EQ(missing.exit_code, 2) << missing.out;
  EXPECT_NE(missing.out.find("error: cannot read /nonexistent/stall.csv"), std::string::npos) << missing.out;
  EXPECT_EQ(missing.out.find("Traceback"), std::string::npos) << missing.out;
  const auto no_kernel = run_tool("ncu_stalls.py", kSample + " --kernel nothing_like_this");
  EXPECT_EQ(no_kernel.exit_code, 1) << no_kernel.out;
  EXPECT_NE(no_kernel.out.find("error: no kernel named 'nothing_like_this'"), std::string::npos) << no_kernel.out;
}

}  // namespace
}  // namespace dsinfer
