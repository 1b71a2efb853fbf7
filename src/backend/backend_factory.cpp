// make_backend(): the one place that knows which backends exist.
#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_gemm_ceiling.h"
#include "core/status.h"

#ifdef DSINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend_factory.h"
#include "backend/cuda/gemm_ceiling.h"
#endif

namespace dsinfer {

bool cuda_backend_available() {
#ifdef DSINFER_HAVE_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name, Precision precision) {
  if (name == "cpu") return std::make_unique<CpuBackend>();
  if (name == "cuda") {
#ifdef DSINFER_HAVE_CUDA
    if (cuda::device_count() > 0) return cuda::make_cuda_backend(precision);
    throw Error(StatusCode::kUnavailable, "backend 'cuda': no CUDA device is visible");
#else
    (void)precision;
    throw Error(StatusCode::kUnavailable, "backend 'cuda': this build has no CUDA backend (nvcc was not found)");
#endif
  }
  throw Error(StatusCode::kInvalidArgument, "unknown backend '" + name + "' (expected cpu or cuda)");
}

double measure_device_copy_bandwidth(const std::string& name) {
#ifdef DSINFER_HAVE_CUDA
  if (name == "cuda" && cuda::device_count() > 0) return cuda::measure_copy_bandwidth_bytes_per_s();
#endif
  return 0.0;
}

double measure_device_gemm_flops(const std::string& backend_name, bool fp8, double sustained_window_s) {
  if (backend_name == "cpu") return cpu::measure_matmul_flops_per_s();
#ifdef DSINFER_HAVE_CUDA
  if (backend_name == "cuda" && cuda::device_count() > 0)
    return fp8 ? cuda::measure_fp8_gemm_flops_per_s(sustained_window_s)
               : cuda::measure_bf16_gemm_flops_per_s(sustained_window_s);
#endif
  (void)fp8;
  (void)sustained_window_s;
  return 0.0;
}

}  // namespace dsinfer
