// tools/sass_early_reads.py, which lists the global loads whose registers an instruction reads
// soon after the load, kernel by kernel, from `cuobjdump -sass` output. The sample's k_a has a
// 128-bit load whose last register a move reads right after it, a load read five instructions
// on, a load whose register is written again before anything reads it, and a 64-bit load whose
// second register a store reads; k_b has no loads.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "run_binary.h"

namespace dsinfer {
namespace {

using testing::run_command;
using testing::run_tool;

const std::string kSample = std::string(DSINFER_SOURCE_DIR) + "/tests/data/sass_sample.sass";

TEST(SassEarlyReadsTest, ListsLoadsReadWithinTheWindowKernelByKernel) {
  const auto r = run_tool("sass_early_reads.py", kSample);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("## k_a\n\n4 global loads, 2 read within 4 instructions"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| 0x0010 `LDG.E.128 R4, desc[UR4][R2.64]` | 0x0020 `IMAD.MOV.U32 R20, RZ, RZ, R7` |"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| 0x00c0 `LDG.E.64 R16, desc[UR4][R2.64+0x30]` | 0x00d0 `STG.E desc[UR4][R2.64], R17` |"),
            std::string::npos)
      << r.out;
  // Five instructions on is past the window; a register written again was never read.
  EXPECT_EQ(r.out.find("| 0x0030"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("| 0x0090"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("## k_b\n\n0 global loads, 0 read within 4 instructions"), std::string::npos) << r.out;
}

TEST(SassEarlyReadsTest, AWiderWindowAndAKernelFilter) {
  const auto r = run_tool("sass_early_reads.py", kSample + " --window 5 --kernel k_a --examples 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("4 global loads, 3 read within 5 instructions"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("k_b"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| 0x0010"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("| 0x0030"), std::string::npos) << r.out;  // one example only
}

TEST(SassEarlyReadsTest, ReadsGzippedListings) {
  const std::string gz = ::testing::TempDir() + "sass_sample.sass.gz";
  ASSERT_EQ(run_command("gzip -c " + kSample + " > " + gz).exit_code, 0);
  const auto r = run_tool("sass_early_reads.py", gz + " --kernel k_a");
  std::remove(gz.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("4 global loads, 2 read within 4 instructions"), std::string::npos) << r.out;
}

TEST(SassEarlyReadsTest, AMissingFileOrKernelIsAnErrorNotATrace) {
  const auto missing = run_tool("sass_early_reads.py", "/nonexistent/k.sass");
  EXPECT_EQ(missing.exit_code, 2) << missing.out;
  EXPECT_NE(missing.out.find("error: cannot read /nonexistent/k.sass"), std::string::npos) << missing.out;
  EXPECT_EQ(missing.out.find("Traceback"), std::string::npos) << missing.out;
  const auto no_kernel = run_tool("sass_early_reads.py", kSample + " --kernel nothing_like_this");
  EXPECT_EQ(no_kernel.exit_code, 1) << no_kernel.out;
  EXPECT_NE(no_kernel.out.find("error: no kernel named 'nothing_like_this'"), std::string::npos) << no_kernel.out;
}

}  // namespace
}  // namespace dsinfer
