// The kernel timeline (a build option, kernel_timeline.h): a replayed step's kernels are
// written one per line, in the order they ran, each named after the kernel that was launched,
// with times that never go back.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/kernel_timeline.h"
#include "cuda_test_util.h"
#include "forward_batch_util.h"

namespace dsinfer {
namespace {

using testing_cuda::bf16_values;
using testing_cuda::random_values;
using testing_cuda::upload;

struct TimelineLine {
  std::string stream, grid, first_block_done, kernel;
  double entered_us = 0, resumed_us = 0;
};

std::vector<TimelineLine> read_timeline(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  std::vector<TimelineLine> lines;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    TimelineLine l;
    std::string order;
    std::getline(fields, order, '\t');
    std::getline(fields, l.stream, '\t');
    std::getline(fields, l.grid, '\t');
    std::string entered, resumed;
    std::getline(fields, entered, '\t');
    std::getline(fields, resumed, '\t');
    std::getline(fields, l.first_block_done, '\t');
    std::getline(fields, l.kernel);
    l.entered_us = std::stod(entered);
    l.resumed_us = std::stod(resumed);
    lines.push_back(l);
  }
  return lines;
}

TEST(CudaKernelTimelineTest, AReplayedStepIsWrittenKernelByKernelInOrder) {
  if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
  if (!cuda::kernel_timeline_built()) GTEST_SKIP() << "built without DSINFER_KERNEL_TIMELINE";
  const std::string path = (std::filesystem::temp_directory_path() / "dsinfer_kernel_timeline_test.tsv").string();
  std::filesystem::remove(path);
  ::setenv("DSINFER_KERNEL_TIMELINE", path.c_str(), 1);
  constexpr int64_t kRows = 2, kDim = 1024;
  {
    auto gpu = make_backend("cuda");
    ASSERT_TRUE(gpu->can_record());
    Tensor x = upload(*gpu, {kRows, kDim}, random_values(kRows * kDim, 1));
    Tensor norm_w = upload(*gpu, {kDim}, random_values(kDim, 2, 0.1f, 1.0f));
    const std::vector<float> w = bf16_values(random_values(kDim * kDim, 3));
    LinearWeight weight = gpu->make_linear(HostTensor{DType::kF32, {kDim, kDim}, w.data()});
    Tensor normed = gpu->empty({kRows, kDim}, DType::kF32), y = gpu->empty({kRows, kDim}, DType::kF32);
    const ForwardBatch batch = testing::single_sequence_batch({5, 6}, 0, 1);
    auto step = [&] {
      gpu->rms_norm(x, norm_w, 1e-6f, normed);
      gpu->linear(normed, weight, y);
      gpu->add(x, y);
    };
    gpu->begin_step(batch);
    step();
    gpu->end_step();
    gpu->begin_step(batch);
    gpu->begin_recording(7);
    step();
    ASSERT_TRUE(gpu->end_recording(7));
    gpu->end_step();
    for (int i = 0; i < 3; ++i) {
      gpu->begin_step(batch);
      ASSERT_TRUE(gpu->replay(7));
      gpu->end_step();
    }
  }  // the backend writes the last replay's kernels as it goes
  ::unsetenv("DSINFER_KERNEL_TIMELINE");

  const std::vector<TimelineLine> lines = read_timeline(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].kernel.find("rms_norm"), std::string::npos) << lines[0].kernel;
  EXPECT_NE(lines[1].kernel.find("gemm"), std::string::npos) << lines[1].kernel;
  EXPECT_NE(lines[2].kernel.find("add_kernel"), std::string::npos) << lines[2].kernel;
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].stream, "main");
    EXPECT_EQ(lines[i].first_block_done, "-") << "none of these kernels notes its first block";
    EXPECT_GE(lines[i].resumed_us, lines[i].entered_us);
    if (i > 0) {
      EXPECT_GT(lines[i].resumed_us, lines[i - 1].resumed_us);
    }
  }
  EXPECT_EQ(lines[0].entered_us, 0.0);
  EXPECT_LT(lines.back().resumed_us, 1e5);  // one replay, not three
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace dsinfer
