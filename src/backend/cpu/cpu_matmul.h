// The CPU backend's fp32 matrix product, written so that every output element is computed with
// the same accumulation order whatever the number of rows or threads: a request's numbers never
// depend on what else is in its batch.
#pragma once

#include <cstdint>

namespace dsinfer::cpu {

// y[m, n] = sum_k x[m, k] * w[n, k]   (x [M, K] row-major, w [N, K] row-major, y [M, N])
void matmul_xwt(const float* x, int64_t num_rows, int64_t k, const float* w, int64_t n, float* y);

// The single-threaded kernel over a column range [n_begin, n_end): for tests and callers that
// parallelise themselves.
void matmul_xwt_cols(const float* x, int64_t num_rows, int64_t k, const float* w, int64_t n_begin,
                     int64_t n_end, int64_t ldy, float* y);

float dot(const float* a, const float* b, int64_t n);
// y[i] += a * x[i]
void axpy(float a, const float* x, float* y, int64_t n);

}  // namespace dsinfer::cpu
