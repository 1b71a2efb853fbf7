// Error checks for CUDA runtime and cuBLASLt calls inside the CUDA backend. A failing call is a
// broken invariant (bad launch, out of device memory mid-step): log where and abort.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/check.h"

#define DS_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    const cudaError_t ds_err_ = (expr);                                                       \
    DS_CHECK_MSG(ds_err_ == cudaSuccess, #expr << ": " << cudaGetErrorString(ds_err_));       \
  } while (0)

#define DS_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                        \
    const cublasStatus_t ds_st_ = (expr);                                                     \
    DS_CHECK_MSG(ds_st_ == CUBLAS_STATUS_SUCCESS, #expr << ": cublas status " << static_cast<int>(ds_st_)); \
  } while (0)

// After a kernel launch: catches bad configurations at once (not asynchronous faults).
#define DS_CUDA_CHECK_LAUNCH() DS_CUDA_CHECK(cudaGetLastError())
