#include "backend/cuda/gemm_ceiling.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/lt_matmul.h"
#include "core/dtype.h"

namespace dsinfer::cuda {
namespace {

constexpr int64_t kDim = 8192;

// Uniform values in [-1, 1) as bf16: a ceiling measured on zero-filled buffers would not be
// trusted (power draw, and so clocks, depend on the data).
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const float u = static_cast<float>(s >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    v[i] = f32_to_bf16(2.0f * u - 1.0f);
  }
  return v;
}

constexpr double kFlopsPerProduct = 2.0 * kDim * kDim * kDim;

// Seconds the device takes for `num_products` calls of `product`, queued back to back between two
// events (the ~µs of event overhead is noise against ~1 ms a product).
class ProductTimer {
 public:
  explicit ProductTimer(cudaStream_t stream) : stream_(stream) {
    DS_CUDA_CHECK(cudaEventCreate(&start_));
    DS_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~ProductTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  ProductTimer(const ProductTimer&) = delete;
  ProductTimer& operator=(const ProductTimer&) = delete;

  template <typename Product>
  double seconds(Product& product, int num_products) {
    DS_CUDA_CHECK(cudaEventRecord(start_, stream_));
    for (int i = 0; i < num_products; ++i) product();
    DS_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    DS_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return static_cast<double>(ms) * 1e-3;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// The best rate of `product` (kFlopsPerProduct per call) over several timed groups after a
// warm-up, which also builds the plan (heuristic query) and brings the clocks up.
template <typename Product>
double best_rate(cudaStream_t stream, Product product) {
  constexpr int kWarmups = 3, kGroups = 6, kPerGroup = 5;
  for (int i = 0; i < kWarmups; ++i) product();
  ProductTimer timer(stream);
  double best = 0.0;
  for (int g = 0; g < kGroups; ++g) {
    const double s = timer.seconds(product, kPerGroup);
    if (s > 0) best = std::max(best, kPerGroup * kFlopsPerProduct / s);
  }
  return best;
}

// The rate of `product` run back to back for about window_s after a warm-up, over the whole
// window: what a pass of that length can count on once the power limit holds the clocks down,
// which a best group of five (a few milliseconds) does not meet.
template <typename Product>
double sustained_rate(cudaStream_t stream, Product product, double window_s) {
  constexpr int kWarmups = 3, kProbe = 3;
  for (int i = 0; i < kWarmups; ++i) product();
  ProductTimer timer(stream);
  const double probe_s = timer.seconds(product, kProbe);
  const int num_products = std::max(kProbe, static_cast<int>(window_s / std::max(probe_s / kProbe, 1e-6)));
  const double window_measured_s = timer.seconds(product, num_products);
  return window_measured_s > 0 ? num_products * kFlopsPerProduct / window_measured_s : 0.0;
}

template <typename Product>
double rate(cudaStream_t stream, Product product, double sustained_window_s) {
  return sustained_window_s > 0 ? sustained_rate(stream, product, sustained_window_s) : best_rate(stream, product);
}

template <typename T>
T* upload(const std::vector<T>& host) {
  T* p = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&p, host.size() * sizeof(T)));
  DS_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

}  // namespace

double measure_bf16_gemm_flops_per_s(double sustained_window_s) {
  const size_t elems = static_cast<size_t>(kDim) * kDim;
  DS_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t stream = nullptr;
  DS_CUDA_CHECK(cudaStreamCreate(&stream));
  uint16_t* w = upload(random_bf16(elems, 1));
  uint16_t* x = upload(random_bf16(elems, 2));
  float* y = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&y, elems * sizeof(float)));
  double best = 0.0;
  {
    LtMatmul lt(stream);
    best = rate(stream, [&] { lt.bf16(w, x, y, kDim, kDim, kDim); }, sustained_window_s);
  }
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  cudaStreamDestroy(stream);
  return best;
}

double measure_fp8_gemm_flops_per_s(double sustained_window_s) {
  const size_t elems = static_cast<size_t>(kDim) * kDim;
  constexpr int64_t kTiles = kDim / 128;
  DS_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t stream = nullptr;
  DS_CUDA_CHECK(cudaStreamCreate(&stream));
  // e4m3 codes of the same uniform values; scales near the ones real weights and activations get.
  auto to_e4m3 = [](const std::vector<uint16_t>& v) {
    std::vector<uint8_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_fp8e4m3(448.0f * bf16_to_f32(v[i]));
    return out;
  };
  uint8_t* w = upload(to_e4m3(random_bf16(elems, 1)));
  uint8_t* x = upload(to_e4m3(random_bf16(elems, 2)));
  float* w_scales = upload(std::vector<float>(kTiles * kTiles, 1e-3f));
  float* x_scales = upload(std::vector<float>(kTiles * kDim, 1e-2f));
  float* y = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&y, elems * sizeof(float)));
  double best = 0.0;
  {
    LtMatmul lt(stream);
    const auto mode = LtMatmul::Fp8WeightScales::kBlocks128x128;
    if (lt.fp8_ready(kDim, kDim, kDim, mode))
      best = rate(stream, [&] { lt.fp8(w, w_scales, mode, x, x_scales, y, kDim, kDim, kDim); },
                  sustained_window_s);
  }
  for (void* p : {static_cast<void*>(w), static_cast<void*>(x), static_cast<void*>(w_scales),
                  static_cast<void*>(x_scales), static_cast<void*>(y)})
    cudaFree(p);
  cudaStreamDestroy(stream);
  return best;
}

}  // namespace dsinfer::cuda
