// The CUDA backend's caching allocator: blocks handed back go to the next request of their size,
// except while work runs on two streams (hold_reuse), when they wait for the streams to join.
#include <gtest/gtest.h>

#include <memory>

#include "backend/cuda/device_allocator.h"
#include "cuda_test_util.h"

namespace dsinfer {
namespace {

class CudaAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
    alloc_ = std::make_shared<cuda::DeviceAllocator>();
  }
  std::shared_ptr<cuda::DeviceAllocator> alloc_;
};

TEST_F(CudaAllocatorTest, HandedBackBlocksWaitWhileReuseIsHeld) {
  void* first = nullptr;
  {
    Tensor t = alloc_->cached({1000}, DType::kF32);
    first = t.data;
  }
  {
    Tensor again = alloc_->cached({1000}, DType::kF32);
    EXPECT_EQ(again.data, first) << "a block handed back serves the next request of its size";
  }

  alloc_->hold_reuse(true);
  void* during = nullptr;
  {
    Tensor t = alloc_->cached({1000}, DType::kF32);  // takes the cached block
    EXPECT_EQ(t.data, first);
  }  // handed back while held
  {
    Tensor t = alloc_->cached({1000}, DType::kF32);
    during = t.data;
    EXPECT_NE(during, first) << "a block handed back during the hold was handed out again";
  }
  EXPECT_EQ(alloc_->cached_bytes(), 0u) << "held blocks are not idle yet";
  alloc_->hold_reuse(false);
  EXPECT_GT(alloc_->cached_bytes(), 0u);

  // Both blocks are back in the cache: two requests at once get the two of them.
  Tensor a = alloc_->cached({1000}, DType::kF32), b = alloc_->cached({1000}, DType::kF32);
  EXPECT_TRUE((a.data == first && b.data == during) || (a.data == during && b.data == first));
}

}  // namespace
}  // namespace dsinfer
