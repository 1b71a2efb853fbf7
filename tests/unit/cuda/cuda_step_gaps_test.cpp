// The device's idle time between steps (Backend::step_gaps): a host that pauses between two
// steps shows as a gap at least as long as the pause; a step enqueued while the last one still
// runs shows none; steps of one new token per sequence count as decode-only.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "cuda_test_util.h"
#include "forward_batch_util.h"

namespace dsinfer {
namespace {

using testing_cuda::bf16_values;
using testing_cuda::random_values;
using testing_cuda::upload;

class CudaStepGapsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
    gpu_ = make_backend("cuda");
    const std::vector<float> w = bf16_values(random_values(kDim * kDim, 1));
    weight_ = gpu_->make_linear(HostTensor{DType::kF32, {kDim, kDim}, w.data()});
    x_ = upload(*gpu_, {kRows, kDim}, random_values(kRows * kDim, 2));
    y_ = gpu_->empty({kRows, kDim}, DType::kF32);
  }
  // A step whose work is `num_products` products of 4096 x 4096 x 4096 (about 0.2 ms each).
  void step(const ForwardBatch& batch, int num_products) {
    gpu_->begin_step(batch);
    for (int i = 0; i < num_products; ++i) gpu_->linear(x_, weight_, y_);
    gpu_->end_step();
  }
  static constexpr int64_t kDim = 4096, kRows = 4096;
  std::unique_ptr<Backend> gpu_;
  LinearWeight weight_;
  Tensor x_, y_;
};

TEST_F(CudaStepGapsTest, PausesShowAsGapsAndQueuedStepsDoNot) {
  const ForwardBatch decode = testing::single_sequence_batch({5, 6, 7}, 2, 1);   // one new token
  const ForwardBatch prefill = testing::single_sequence_batch({5, 6, 7}, 0, 1);  // three
  ASSERT_TRUE(gpu_->step_gaps().has_value());  // starts counting here

  // Back to back: the next step is enqueued while 50 products of the last one still run.
  step(decode, 50);
  step(decode, 1);
  step(prefill, 1);
  auto gaps = gpu_->step_gaps();
  ASSERT_TRUE(gaps.has_value());
  EXPECT_EQ(gaps->all.num_gaps, 2);
  EXPECT_EQ(gaps->decode_only.num_gaps, 1);  // decode → decode; decode → prefill is not
  EXPECT_LT(gaps->all.max_us, 1000.0);

  // A host that waits for the device and then sleeps leaves the device idle that long.
  step(decode, 1);
  gpu_->to_host(y_, std::vector<float>(kRows * kDim).data());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  step(decode, 1);
  gaps = gpu_->step_gaps();
  EXPECT_EQ(gaps->all.num_gaps, 1);  // the pair across the last call is not counted
  EXPECT_GE(gaps->all.max_us, 15000.0);
  EXPECT_EQ(gaps->decode_only.num_gaps, 1);
}

TEST(CpuStepGapsTest, TheCpuBackendDoesNotMeasureGaps) { EXPECT_FALSE(make_backend("cpu")->step_gaps().has_value()); }

}  // namespace
}  // namespace dsinfer
