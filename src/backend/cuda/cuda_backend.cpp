// The CUDA backend's tensors, weights and simple ops; attention and MoE are in
// cuda_backend_layers.cpp.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_factory.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/lt_matmul.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/weights_fp8.h"

namespace dsinfer::cuda {
namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

int64_t num_elements_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A checkpoint tensor widened to fp32 on the host, FP8 block scales applied.
std::vector<float> widen_host(const HostTensor& h) {
  const int64_t n = num_elements_of(h.shape);
  std::vector<float> out(n);
  if (h.dtype == DType::kF8E4M3 && h.scale_inv != nullptr) {
    DS_CHECK(h.shape.size() == 2);
    dequantize_fp8_block(static_cast<const uint8_t*>(h.data), h.scale_inv, h.shape[0], h.shape[1], h.block_rows,
                         h.block_cols, out.data());
  } else {
    convert_to_f32(h.dtype, h.data, out.data(), n);
  }
  return out;
}

// Offset of the block scales behind an FP8 weight's bytes (16-byte alignment for cuBLASLt).
size_t fp8_scales_offset(int64_t rows_padded, int64_t cols_padded) {
  return static_cast<size_t>(round_up(rows_padded * cols_padded, 256));
}

}  // namespace

CudaBackend::CudaBackend() {
  DS_CUDA_CHECK(cudaSetDevice(0));
  DS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  alloc_ = std::make_shared<DeviceAllocator>();
  matmul_ = std::make_unique<LtMatmul>(stream_);
  DS_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, 0));
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  matmul_.reset();
  cudaStreamDestroy(stream_);
}

void CudaBackend::synchronize() { DS_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Tensor CudaBackend::empty(const std::vector<int64_t>& shape, DType dtype) { return alloc_->cached(shape, dtype); }

Tensor CudaBackend::upload_ints(const std::vector<int32_t>& v) {
  Tensor t = alloc_->cached({static_cast<int64_t>(v.size())}, DType::kI32);
  if (!v.empty())
    DS_CUDA_CHECK(cudaMemcpyAsync(t.data, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  return t;
}

Tensor CudaBackend::view_rows(const Tensor& t, int64_t row_begin, int64_t num_rows) const {
  Tensor v = t;
  const int64_t row_elems = t.num_elements() / t.dim(0);
  v.data = static_cast<char*>(t.data) + row_begin * row_elems * dtype_size_bytes(t.dtype);
  v.shape[0] = num_rows;
  return v;
}

Tensor CudaBackend::from_host(const HostTensor& host) {
  if (host.dtype == DType::kI32 || host.dtype == DType::kI64) {
    Tensor t = alloc_->persistent(host.shape, host.dtype);
    DS_CUDA_CHECK(cudaMemcpyAsync(t.data, host.data, t.num_bytes(), cudaMemcpyHostToDevice, stream_));
    return t;
  }
  Tensor t = alloc_->persistent(host.shape, DType::kF32);
  if (host.dtype == DType::kF32) {
    DS_CUDA_CHECK(cudaMemcpyAsync(t.data, host.data, t.num_bytes(), cudaMemcpyHostToDevice, stream_));
  } else {
    const std::vector<float> wide = widen_host(host);
    DS_CUDA_CHECK(cudaMemcpyAsync(t.data, wide.data(), t.num_bytes(), cudaMemcpyHostToDevice, stream_));
  }
  return t;
}

void CudaBackend::to_host(const Tensor& t, float* dst) {
  if (t.dtype == DType::kBF16) {
    std::vector<uint16_t> bits(t.num_elements());
    DS_CUDA_CHECK(cudaMemcpyAsync(bits.data(), t.data, t.num_bytes(), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    for (size_t i = 0; i < bits.size(); ++i) dst[i] = bf16_to_f32(bits[i]);
    return;
  }
  DS_CHECK(t.dtype == DType::kF32);
  DS_CUDA_CHECK(cudaMemcpyAsync(dst, t.data, t.num_bytes(), cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

// Runs one small block-scaled FP8 product through cuBLASLt and checks it against the same
// weight dequantised to bf16: the scale layouts are the library's convention, so the backend
// verifies them on the device it runs on before trusting them with a model.
bool CudaBackend::fp8_matmul_works() {
  const int64_t n = 256, k = 384, m = 8;
  if (!matmul_->fp8_supported(n, k) || !matmul_->fp8_plan_ok(m, n, k)) return false;
  std::vector<uint8_t> w_bytes(n * k);
  std::vector<float> scales = {0.5f, 0.25f, 2.0f, 1.0f, 0.125f, 4.0f};  // [2, 3] blocks
  std::vector<float> x(m * k);
  uint32_t state = 12345;
  auto next = [&state]() {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
  };
  for (auto& b : w_bytes) b = f32_to_fp8e4m3(8.0f * next());
  for (auto& v : x) v = next();
  HostTensor h{DType::kF8E4M3, {n, k}, w_bytes.data(), scales.data(), 128, 128};
  LinearWeight fp8 = make_fp8_linear(h), ref = make_bf16_linear(h);
  Tensor tx = from_host(HostTensor{DType::kF32, {m, k}, x.data()});
  Tensor y_fp8 = empty({m, n}, DType::kF32), y_ref = empty({m, n}, DType::kF32);
  matmul_->set_fp8_soft_fail(true);
  linear(tx, fp8, y_fp8);
  matmul_->set_fp8_soft_fail(false);
  if (matmul_->take_fp8_failure()) {
    DS_LOG_WARN("cuda: cuBLASLt's block-scaled FP8 matmul failed to run; FP8 weights will be dequantised to bf16");
    return false;
  }
  linear(tx, ref, y_ref);
  std::vector<float> a(m * n), b(m * n);
  to_host(y_fp8, a.data());
  to_host(y_ref, b.data());
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::abs(a[i] - b[i])));
    max_ref = std::max(max_ref, static_cast<double>(std::abs(b[i])));
  }
  const bool ok = max_ref > 0 && max_diff <= 0.08 * max_ref;
  if (!ok)
    DS_LOG_WARN("cuda: cuBLASLt's block-scaled FP8 matmul disagrees with the bf16 reference (max error "
                << max_diff << " of " << max_ref << "); FP8 weights will be dequantised to bf16");
  return ok;
}

LinearWeight CudaBackend::make_linear(const HostTensor& w) {
  DS_CHECK(w.shape.size() == 2);
  if (w.dtype == DType::kF8E4M3) {
    if (fp8_state_ == 0) {
      // DSINFER_CUDA_FP8=0 forces the bf16 path (for comparisons and as an escape hatch).
      const char* env = std::getenv("DSINFER_CUDA_FP8");
      const bool allowed = env == nullptr || std::string(env) != "0";
      fp8_state_ = allowed && fp8_matmul_works() ? 1 : -1;
    }
    if (fp8_state_ > 0 && w.scale_inv != nullptr && w.block_rows == 128 && w.block_cols == 128 &&
        matmul_->fp8_supported(round_up(w.shape[0], 4), round_up(w.shape[1], 128)))
      return make_fp8_linear(w);
    if (!warned_fp8_fallback_) {
      warned_fp8_fallback_ = true;
      DS_LOG_WARN("cuda: FP8 matmul not used for a [" << w.shape[0] << ", " << w.shape[1]
                                                       << "] weight; dequantising FP8 weights to bf16");
    }
  }
  return make_bf16_linear(w);
}

LinearWeight CudaBackend::make_bf16_linear(const HostTensor& w) {
  LinearWeight lw;
  lw.out_features = w.shape[0];
  lw.in_features = w.shape[1];
  lw.weight = alloc_->persistent(w.shape, DType::kBF16);
  const int64_t n = lw.out_features * lw.in_features;
  if (w.dtype == DType::kBF16) {
    DS_CUDA_CHECK(cudaMemcpyAsync(lw.weight.data, w.data, n * 2, cudaMemcpyHostToDevice, stream_));
    return lw;
  }
  // Round to bf16 on the host (all threads) so that only 2 bytes per weight cross PCIe.
  std::vector<float> wide;
  const float* src = static_cast<const float*>(w.data);
  if (w.dtype != DType::kF32) {
    wide = widen_host(w);
    src = wide.data();
  }
  std::vector<uint16_t> narrow(n);
  global_thread_pool().parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) narrow[i] = f32_to_bf16(src[i]);
  }, int64_t{1} << 16);
  DS_CUDA_CHECK(cudaMemcpyAsync(lw.weight.data, narrow.data(), n * 2, cudaMemcpyHostToDevice, stream_));
  return lw;
}

LinearWeight CudaBackend::make_fp8_linear(const HostTensor& w) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  const int64_t rows_p = round_up(rows, 4), cols_p = round_up(cols, 128);
  const int64_t row_blocks = (rows + 127) / 128, col_blocks = (cols + 127) / 128;
  const int64_t col_blocks_p = round_up(col_blocks, 4);
  // Host image of [weight bytes, zero-padded | scales [row_blocks, col_blocks_p]].
  const size_t scales_at = fp8_scales_offset(rows_p, cols_p);
  // 256 bytes of slack behind the scales: the kernels' reads are the library's business.
  std::vector<uint8_t> image(scales_at + row_blocks * col_blocks_p * sizeof(float) + 256, 0);
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(image.data() + r * cols_p, src + r * cols, cols);
  float* scales = reinterpret_cast<float*>(image.data() + scales_at);
  for (int64_t rb = 0; rb < row_blocks; ++rb)
    for (int64_t cb = 0; cb < col_blocks_p; ++cb)
      scales[rb * col_blocks_p + cb] = cb < col_blocks ? w.scale_inv[rb * col_blocks + cb] : 1.0f;
  Tensor storage = alloc_->persistent_bytes(image.size());
  DS_CUDA_CHECK(cudaMemcpyAsync(storage.data, image.data(), image.size(), cudaMemcpyHostToDevice, stream_));
  synchronize();  // the host image goes out of scope
  LinearWeight lw;
  lw.out_features = rows;
  lw.in_features = cols;
  lw.weight = storage;
  lw.weight.shape = {rows_p, cols_p};
  lw.weight.dtype = DType::kF8E4M3;
  return lw;
}

void CudaBackend::linear(const Tensor& x, const LinearWeight& w, Tensor& out) {
  DS_CHECK_MSG(x.dim(1) == w.in_features, "linear: input width " << x.dim(1) << " vs " << w.in_features);
  DS_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
  const int64_t m = x.dim(0), n = w.out_features, k = w.in_features;
  if (m == 0) return;
  if (w.weight.dtype == DType::kBF16) {
    Tensor xb = alloc_->cached({m, k}, DType::kBF16);
    launch_f32_to_bf16(x.as<float>(), xb.as<uint16_t>(), m * k, stream_);
    if (reinterpret_cast<uintptr_t>(out.data) % LtMatmul::kMinAlignmentBytes == 0) {
      matmul_->bf16(w.weight.as<uint16_t>(), xb.as<uint16_t>(), out.as<float>(), m, n, k);
      return;
    }
    // A row slice that starts off alignment: compute aside, then copy.
    Tensor y = alloc_->cached({m, n}, DType::kF32);
    matmul_->bf16(w.weight.as<uint16_t>(), xb.as<uint16_t>(), y.as<float>(), m, n, k);
    DS_CUDA_CHECK(cudaMemcpyAsync(out.data, y.data, y.num_bytes(), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  DS_CHECK(w.weight.dtype == DType::kF8E4M3);
  const int64_t n_p = w.weight.dim(0), k_p = w.weight.dim(1), m_p = round_up(m, 4);
  const uint8_t* wq = w.weight.as<uint8_t>();
  const float* w_scales = reinterpret_cast<const float*>(wq + fp8_scales_offset(n_p, k_p));
  if (!matmul_->fp8_plan_ok(m_p, n_p, k_p)) {
    // No FP8 algorithm for this token count: dequantise the weight for this call instead.
    Tensor wb = alloc_->cached({n, k}, DType::kBF16);
    launch_dequantize_fp8_to_bf16(wq, k_p, w_scales, round_up((k + 127) / 128, 4), n, k, wb.as<uint16_t>(), stream_);
    Tensor xb = alloc_->cached({m, k}, DType::kBF16);
    launch_f32_to_bf16(x.as<float>(), xb.as<uint16_t>(), m * k, stream_);
    Tensor y = alloc_->cached({m, n}, DType::kF32);
    matmul_->bf16(wb.as<uint16_t>(), xb.as<uint16_t>(), y.as<float>(), m, n, k);
    DS_CUDA_CHECK(cudaMemcpyAsync(out.data, y.data, y.num_bytes(), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  Tensor xq = alloc_->cached({m_p, k_p}, DType::kU8);
  Tensor xs = alloc_->cached({k_p / 128, m_p}, DType::kF32);
  launch_quantize_fp8_1x128(x.as<float>(), m, k, m_p, k_p, xq.as<uint8_t>(), xs.as<float>(), stream_);
  Tensor yb = alloc_->cached({m_p, n_p}, DType::kBF16);
  if (matmul_->fp8(wq, w_scales, xq.as<uint8_t>(), xs.as<float>(), yb.as<uint16_t>(), m_p, n_p, k_p))
    launch_bf16_to_f32_transposed(yb.as<uint16_t>(), m_p, m, n, out.as<float>(), stream_);
  else
    launch_bf16_to_f32_rows(yb.as<uint16_t>(), n_p, m, n, out.as<float>(), stream_);
}

void CudaBackend::embedding(const Tensor& table, std::span<const TokenId> ids, Tensor& out) {
  const int64_t vocab = table.dim(0), hidden = table.dim(1);
  std::vector<int32_t> rows(ids.begin(), ids.end());
  for (int32_t id : rows) DS_CHECK_MSG(id >= 0 && id < vocab, "token id " << id << " outside vocab " << vocab);
  Tensor d_rows = upload_ints(rows);
  launch_gather_rows(table.as<float>(), d_rows.as<int32_t>(), static_cast<int64_t>(rows.size()), hidden,
                     out.as<float>(), stream_);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  launch_rms_norm(x.as<float>(), w.as<float>(), eps, x.dim(0), x.dim(1), out.as<float>(), stream_);
}

void CudaBackend::add(Tensor& x, const Tensor& y) {
  DS_CHECK(y.num_elements() == x.num_elements());
  launch_add(x.as<float>(), y.as<float>(), x.num_elements(), stream_);
}

void CudaBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  launch_silu_mul(gate_up.as<float>(), gate_up.dim(0), gate_up.dim(1) / 2, out.as<float>(), stream_);
}

void CudaBackend::concat_cols(const Tensor& a, const Tensor& b, Tensor& out) {
  launch_concat_cols(a.as<float>(), b.as<float>(), a.dim(0), a.dim(1), b.dim(1), out.as<float>(), stream_);
}

void CudaBackend::gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) {
  const int64_t num_rows = x.dim(0);
  std::vector<int32_t> r(rows.begin(), rows.end());
  for (int32_t i : r) DS_CHECK_MSG(i >= 0 && i < num_rows, "gather_rows: row " << i << " of " << num_rows);
  Tensor d_rows = upload_ints(r);
  launch_gather_rows(x.as<float>(), d_rows.as<int32_t>(), static_cast<int64_t>(r.size()), x.dim(1), out.as<float>(),
                     stream_);
}

void CudaBackend::read_cache_block(const LayerKvCache& cache, int32_t block, float* dst) {
  const int64_t per_block = cache.data.dim(1) * cache.data.dim(2);
  DS_CUDA_CHECK(cudaMemcpyAsync(dst, cache.data.as<float>() + block * per_block, per_block * 4,
                                cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void CudaBackend::write_cache_block(LayerKvCache& cache, int32_t block, const float* src) {
  const int64_t per_block = cache.data.dim(1) * cache.data.dim(2);
  DS_CUDA_CHECK(cudaMemcpyAsync(cache.data.as<float>() + block * per_block, src, per_block * 4,
                                cudaMemcpyHostToDevice, stream_));
  synchronize();  // the caller may reuse src at once
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

double measure_copy_bandwidth_bytes_per_s() {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  DS_CUDA_CHECK(cudaSetDevice(0));
  DS_CUDA_CHECK(cudaMalloc(&a, bytes));
  DS_CUDA_CHECK(cudaMalloc(&b, bytes));
  DS_CUDA_CHECK(cudaMemset(a, 1, bytes));
  cudaEvent_t start, stop;
  DS_CUDA_CHECK(cudaEventCreate(&start));
  DS_CUDA_CHECK(cudaEventCreate(&stop));
  double best = 0.0;
  for (int rep = 0; rep < 6; ++rep) {
    DS_CUDA_CHECK(cudaEventRecord(start));
    DS_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    DS_CUDA_CHECK(cudaEventRecord(stop));
    DS_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (rep > 0 && ms > 0.0f) best = std::max(best, 2.0 * bytes / (ms * 1e-3));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return best;
}

}  // namespace dsinfer::cuda
