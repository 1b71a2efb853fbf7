// tools/prefill_ab.py, which runs the prefill bench for each variant in turn over several rounds
// and tables the runs: here against a stand-in bench script (tests/data/fake_prefill_bench.sh).
#include <gtest/gtest.h>

#include <string>

#include "run_binary.h"

namespace dsinfer {
namespace {

using testing::run_tool;

const std::string kFake = std::string(DSINFER_SOURCE_DIR) + "/tests/data/fake_prefill_bench.sh";

TEST(PrefillAbTest, AlternatesVariantsWithTheirSettingsAndTablesMedians) {
  const auto r = run_tool("prefill_ab.py", "--rounds 3 base=" + kFake + " new=" + kFake +
                                               ",FAKE_RATE=120000,FAKE_CLOCK=1790");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string base1 = "| base | 1 | 118,407 | 45.6% | 51.2% | 1821 MHz |";
  const std::string new1 = "| new | 1 | 120,000 | 45.6% | 51.2% | 1790 MHz |";
  const std::string base2 = "| base | 2 | 118,407";
  const std::string new3 = "| new | 3 | 120,000";
  ASSERT_NE(r.out.find(base1), std::string::npos) << r.out;
  ASSERT_NE(r.out.find(new1), std::string::npos) << r.out;
  // One variant after the other within each round.
  EXPECT_LT(r.out.find(base1), r.out.find(new1));
  EXPECT_LT(r.out.find(new1), r.out.find(base2));
  EXPECT_NE(r.out.find(new3), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| base | 118,407 | 3 of 3 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| new | 120,000 | 3 of 3 |"), std::string::npos) << r.out;
}

TEST(PrefillAbTest, ABenchWithoutClockSamplesLeavesThoseCellsEmpty) {
  const auto r = run_tool("prefill_ab.py", "--rounds 1 plain=" + kFake + ",FAKE_PLAIN=1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("| plain | 1 | 118,407 | 45.6% | — | — |"), std::string::npos) << r.out;
}

TEST(PrefillAbTest, FailedAndStalledRunsAreNamedAndTheOthersStillRun) {
  const auto r = run_tool("prefill_ab.py", "--rounds 1 --timeout 1 failing=" + kFake + ",FAKE_EXIT=3 stalled=" +
                                               kFake + ",FAKE_SLEEP=5 missing=/nonexistent/dsinfer ok=" + kFake);
  EXPECT_EQ(r.exit_code, 1) << r.out;  // not every variant has a run
  EXPECT_NE(r.out.find("| failing | 1 | exit status 3 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| stalled | 1 | timed out after 1.0 s |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| missing | 1 | cannot run:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| ok | 1 | 118,407"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| failing | — | 0 of 1 |"), std::string::npos) << r.out;
}

TEST(PrefillAbTest, AMalformedVariantIsRefusedBeforeAnyRun) {
  const auto r = run_tool("prefill_ab.py", "base=" + kFake + " new" + " other=" + kFake + ",NOTASETTING");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("error: variant 'new'"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("| base | 1"), std::string::npos) << r.out;
}

TEST(PrefillAbTest, DecodeModeTablesEachBatchAndItsMedians) {
  const auto r = run_tool("prefill_ab.py", "--decode --rounds 2 base=" + kFake + ",FAKE_DECODE=1 new=" + kFake +
                                               ",FAKE_DECODE=1,FAKE_DECODE_RATE=500.5 prefill=" + kFake);
  EXPECT_EQ(r.exit_code, 1) << r.out;  // the prefill bench has no decode rows
  const std::string base1 = "| base | 1 | 1 | 429.1 | 28% |";
  const std::string new1 = "| new | 1 | 1 | 500.5 | 28% |";
  ASSERT_NE(r.out.find(base1), std::string::npos) << r.out;
  ASSERT_NE(r.out.find(new1), std::string::npos) << r.out;
  EXPECT_LT(r.out.find(base1), r.out.find("| base | 1 | 2 | 578.7 | 28% |"));
  EXPECT_LT(r.out.find(base1), r.out.find(new1));
  EXPECT_NE(r.out.find("| new | 2 | 1 | 500.5 | 28% |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| prefill | 1 | no decode rows in its output |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| base | 1 | 429.1 | 2 of 2 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| new | 1 | 500.5 | 2 of 2 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| new | 2 | 578.7 | 2 of 2 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| prefill | 1 | — | 0 of 2 |"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dsinfer
