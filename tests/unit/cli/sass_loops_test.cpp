// tools/sass_loops.py, which lists each kernel's loops (a backward branch's target to the branch)
// with their instruction counts by opcode. The sample's k_loop is `cuobjdump -sass` output with
// branch targets as addresses: an inner loop of five instructions inside an outer one of eight,
// which stores to local memory; k_labels is `nvdisasm` output with labels: a forward branch,
// which is no loop, and a loop of three instructions.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "run_binary.h"

namespace dsinfer {
namespace {

using testing::run_command;
using testing::run_tool;

const std::string kSample = std::string(DSINFER_SOURCE_DIR) + "/tests/data/sass_loops_sample.sass";

TEST(SassLoopsTest, ListsEachKernelsLoopsWithTheirOpcodes) {
  const auto r = run_tool("sass_loops.py", kSample + " --count FFMA,STL");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("## k_loop\n\n9 instructions, 2 loops of 1 or more"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| loop | instructions | FFMA | STL | most frequent |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| 0x0000-0x0070 | 8 | 1 | 1 | BRA 2, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| 0x0010-0x0050 | 5 | 1 | 0 | "), std::string::npos) << r.out;
  // Labels as targets; the forward branch to .L_x_1 is not a loop.
  EXPECT_NE(r.out.find("## k_labels\n\n5 instructions, 1 loop of 1 or more"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| 0x0010-0x0030 | 3 | 0 | 0 | BRA 2, FADD 1 |"), std::string::npos) << r.out;
}

TEST(SassLoopsTest, AKernelFilterAndALeastSize) {
  const auto r = run_tool("sass_loops.py", kSample + " --kernel k_loop --min 6 --ops 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find("k_labels"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("9 instructions, 1 loop of 6 or more"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| 0x0000-0x0070 | 8 | 0 | 1 | BRA 2 |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("| 0x0010-0x0050"), std::string::npos) << r.out;
}

TEST(SassLoopsTest, ReadsGzippedListings) {
  const std::string gz = ::testing::TempDir() + "sass_loops_sample.sass.gz";
  ASSERT_EQ(run_command("gzip -c " + kSample + " > " + gz).exit_code, 0);
  const auto r = run_tool("sass_loops.py", gz + " --kernel k_labels");
  std::remove(gz.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("5 instructions, 1 loop of 1 or more"), std::string::npos) << r.out;
}

TEST(SassLoopsTest, AMissingFileOrKernelIsAnErrorNotATrace) {
  const auto missing = run_tool("sass_loops.py", "/nonexistent/k.sass");
  EXPECT_EQ(missing.exit_code, 2) << missing.out;
  EXPECT_NE(missing.out.find("error: cannot read /nonexistent/k.sass"), std::string::npos) << missing.out;
  EXPECT_EQ(missing.out.find("Traceback"), std::string::npos) << missing.out;
  const auto no_kernel = run_tool("sass_loops.py", kSample + " --kernel nothing_like_this");
  EXPECT_EQ(no_kernel.exit_code, 1) << no_kernel.out;
  EXPECT_NE(no_kernel.out.find("error: no kernel named 'nothing_like_this'"), std::string::npos) << no_kernel.out;
}

}  // namespace
}  // namespace dsinfer
