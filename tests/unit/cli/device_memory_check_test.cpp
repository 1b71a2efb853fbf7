// tools/device_memory_check.py, the GPU machine's check of the server's device memory. Here,
// without a GPU, only what it does before a server runs: its usage, and a server that cannot
// start reported as a failed check with the server's own words.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "backend/backend.h"
#include "run_binary.h"

namespace dsinfer {
namespace {

using testing::run_tool;

TEST(DeviceMemoryCheckTest, WithoutArgumentsPrintsItsUsage) {
  const auto r = run_tool("device_memory_check.py", "");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("usage: tools/device_memory_check.py DSINFER_BINARY MODEL_DIR"), std::string::npos) << r.out;
}

TEST(DeviceMemoryCheckTest, AServerThatCannotStartIsAFailedCheck) {
  if (cuda_backend_available()) GTEST_SKIP() << "a GPU is visible: the server would start";
  const std::string dir = ::testing::TempDir() + "/device_memory_check";
  std::filesystem::remove_all(dir);
  const std::string model = std::string(DSINFER_SOURCE_DIR) + "/tests/data/tiny_v3";
  const auto r = run_tool("device_memory_check.py", std::string(DSINFER_BINARY) + " " + model + " " + dir);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("FAILED  the server did not start"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cuda"), std::string::npos) << "the server's own error is shown: " << r.out;
}

}  // namespace
}  // namespace dsinfer
