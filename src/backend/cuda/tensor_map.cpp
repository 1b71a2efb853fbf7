#include "backend/cuda/tensor_map.h"

#include <cuda_runtime.h>

#include <sstream>

#include "core/status.h"

namespace dsinfer::cuda {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || entry == nullptr)
      throw Error(StatusCode::kUnavailable, "backend 'cuda': the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<EncodeTiled>(entry);
  }();
  return fn;
}

}  // namespace

CUtensorMap encode_tensor_map(const TensorMap2d& m) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {m.inner, m.outer};
  const cuuint64_t strides[1] = {m.row_bytes};
  const cuuint32_t box[2] = {m.box_inner, m.box_outer};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, m.type, 2, const_cast<void*>(m.base), dims, strides, box, element_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    m.swizzle_128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::ostringstream msg;
    msg << "backend 'cuda': a tensor map of " << m.outer << " x " << m.inner << " elements (" << m.row_bytes
        << " bytes a row, boxes of " << m.box_outer << " x " << m.box_inner << ") was refused (CUresult " << r
        << ")";
    throw Error(StatusCode::kInternal, msg.str());
  }
  return map;
}

}  // namespace dsinfer::cuda
