#include "backend/cpu/cpu_matmul.h"

#include <immintrin.h>

#include <algorithm>

#include "core/thread_pool.h"

namespace dsinfer::cpu {
namespace {

// Every dot product: eight fp32 lanes accumulate k in steps of 8 (fused multiply-add), the lanes
// are summed in a fixed tree, then the tail k % 8 is added in order. Blocking over rows and
// columns only changes which products are computed together, never this order.

__attribute__((target("avx2,fma"))) inline float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);                 // 4 lanes
  __m128 sh = _mm_movehl_ps(s, s);
  s = _mm_add_ps(s, sh);                         // 2 lanes
  sh = _mm_shuffle_ps(s, s, 0x1);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t i = 0; i < n8; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = hsum8(acc);
  for (int64_t i = n8; i < n; ++i) s += a[i] * b[i];
  return s;
}

// 2 rows x 4 columns of outputs at once: 8 independent accumulators share the loads.
__attribute__((target("avx2,fma"))) void kernel_2x4(const float* x0, const float* x1, const float* const* w,
                                                      int64_t k, float* out0, float* out1) {
  __m256 a00 = _mm256_setzero_ps(), a01 = _mm256_setzero_ps(), a02 = _mm256_setzero_ps(), a03 = _mm256_setzero_ps();
  __m256 a10 = _mm256_setzero_ps(), a11 = _mm256_setzero_ps(), a12 = _mm256_setzero_ps(), a13 = _mm256_setzero_ps();
  const int64_t k8 = k & ~int64_t{7};
  for (int64_t i = 0; i < k8; i += 8) {
    const __m256 v0 = _mm256_loadu_ps(x0 + i);
    const __m256 v1 = _mm256_loadu_ps(x1 + i);
    __m256 wv = _mm256_loadu_ps(w[0] + i);
    a00 = _mm256_fmadd_ps(v0, wv, a00);
    a10 = _mm256_fmadd_ps(v1, wv, a10);
    wv = _mm256_loadu_ps(w[1] + i);
    a01 = _mm256_fmadd_ps(v0, wv, a01);
    a11 = _mm256_fmadd_ps(v1, wv, a11);
    wv = _mm256_loadu_ps(w[2] + i);
    a02 = _mm256_fmadd_ps(v0, wv, a02);
    a12 = _mm256_fmadd_ps(v1, wv, a12);
    wv = _mm256_loadu_ps(w[3] + i);
    a03 = _mm256_fmadd_ps(v0, wv, a03);
    a13 = _mm256_fmadd_ps(v1, wv, a13);
  }
  float s[8] = {hsum8(a00), hsum8(a01), hsum8(a02), hsum8(a03),
                hsum8(a10), hsum8(a11), hsum8(a12), hsum8(a13)};
  for (int64_t i = k8; i < k; ++i) {
    for (int c = 0; c < 4; ++c) {
      s[c] += x0[i] * w[c][i];
      s[4 + c] += x1[i] * w[c][i];
    }
  }
  for (int c = 0; c < 4; ++c) {
    out0[c] = s[c];
    out1[c] = s[4 + c];
  }
}

__attribute__((target("avx2,fma"))) void cols_avx2(const float* x, int64_t num_rows, int64_t k, const float* w,
                                                    int64_t n_begin, int64_t n_end, int64_t ldy, float* y) {
  constexpr int64_t kRowBlock = 16;
  for (int64_t m0 = 0; m0 < num_rows; m0 += kRowBlock) {
    const int64_t m1 = std::min(num_rows, m0 + kRowBlock);
    int64_t n = n_begin;
    for (; n + 4 <= n_end; n += 4) {
      const float* wp[4] = {w + n * k, w + (n + 1) * k, w + (n + 2) * k, w + (n + 3) * k};
      int64_t m = m0;
      for (; m + 2 <= m1; m += 2) kernel_2x4(x + m * k, x + (m + 1) * k, wp, k, y + m * ldy + n, y + (m + 1) * ldy + n);
      for (; m < m1; ++m) {
        for (int c = 0; c < 4; ++c) y[m * ldy + n + c] = dot_avx2(x + m * k, wp[c], k);
      }
    }
    for (; n < n_end; ++n) {
      for (int64_t m = m0; m < m1; ++m) y[m * ldy + n] = dot_avx2(x + m * k, w + n * k, k);
    }
  }
}

// Portable path with the same lane structure (used where AVX2 is missing).
float dot_portable(const float* a, const float* b, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t i = 0; i < n8; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += a[i + l] * b[i + l];
  float s = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
  for (int64_t i = n8; i < n; ++i) s += a[i] * b[i];
  return s;
}

__attribute__((target("avx2,fma"))) void axpy_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t i = 0; i < n8; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (int64_t i = n8; i < n; ++i) y[i] += a * x[i];
}

bool have_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

}  // namespace

float dot(const float* a, const float* b, int64_t n) {
  return have_avx2() ? dot_avx2(a, b, n) : dot_portable(a, b, n);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  if (have_avx2()) {
    axpy_avx2(a, x, y, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void matmul_xwt_cols(const float* x, int64_t num_rows, int64_t k, const float* w, int64_t n_begin,
                     int64_t n_end, int64_t ldy, float* y) {
  if (have_avx2()) {
    cols_avx2(x, num_rows, k, w, n_begin, n_end, ldy, y);
    return;
  }
  for (int64_t m = 0; m < num_rows; ++m)
    for (int64_t n = n_begin; n < n_end; ++n) y[m * ldy + n] = dot_portable(x + m * k, w + n * k, k);
}

void matmul_xwt(const float* x, int64_t num_rows, int64_t k, const float* w, int64_t n, float* y) {
  if (num_rows <= 0 || n <= 0) return;
  // Split the output columns; each thread streams its slice of the weights once per row block.
  const int64_t work = num_rows * n * k;
  const int64_t min_cols = work < (1 << 16) ? n : 16;
  global_thread_pool().parallel_for(
      (n + 3) / 4,
      [&](int64_t b, int64_t e) { matmul_xwt_cols(x, num_rows, k, w, b * 4, std::min(n, e * 4), n, y); },
      std::max<int64_t>(1, min_cols / 4));
}

}  // namespace dsinfer::cpu
