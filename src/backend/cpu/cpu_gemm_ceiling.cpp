#include "backend/cpu/cpu_gemm_ceiling.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/cpu_matmul.h"

namespace dsinfer::cpu {

double measure_matmul_flops_per_s() {
  // Large enough that each thread's slice of W outgrows the L2 cache, as a model's weights do,
  // and that the thread-pool dispatch is noise; small enough to cost well under a second.
  constexpr int64_t kRows = 512, kCols = 2048, kInner = 2048;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(kRows * kInner), w(kCols * kInner), y(kRows * kCols);
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng);
  double best = 0.0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    matmul_xwt(x.data(), kRows, kInner, w.data(), kCols, y.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0 && s > 0) best = std::max(best, 2.0 * kRows * kCols * kInner / s);  // rep 0 warms up
  }
  return best;
}

}  // namespace dsinfer::cpu
