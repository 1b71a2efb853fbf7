// The CUDA backend as the rest of the program sees it: plain C++, no CUDA headers, so that
// make_backend() and the bench can name it without a CUDA toolchain in their include path.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace dsinfer::cuda {

// Number of visible CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();

// A backend on device 0 (Precision::kFp32: its fp32 precision mode, as DSINFER_CUDA_PRECISION=fp32
// also asks). Throws dsinfer::Error when the device cannot be initialised.
std::unique_ptr<Backend> make_cuda_backend(Precision precision = Precision::kDefault);

// Device-to-device cudaMemcpy bandwidth on device 0, counted as bytes read + bytes written per
// second (best of several 1 GiB copies): the ceiling that decode bandwidth is compared with.
double measure_copy_bandwidth_bytes_per_s();

}  // namespace dsinfer::cuda
