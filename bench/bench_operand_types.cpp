// What 16-bit operands other than bf16 would cost and give. The default path's products read
// bf16 activations, whose 8-bit mantissas move near-tied greedy steps of the golden fixtures;
// ten mantissa bits (f16's, TF32's) reach 99% agreement on the CPU backend's study
// (DSINFER_CPU_PRODUCT_INPUTS=f16, docs/cuda.md "Known gaps"). This bench prices the two ways
// to ten bits on the tensor cores: cuBLASLt's dense product rate with bf16, f16 and TF32
// operands (fp32 sums, fp32 output), each as a ratio to bf16's in the same run, at 8192³ and at
// the V2-Lite shapes of a 4 × 4k prefill; and each type's error against an fp32 product of the
// same fp32 inputs, so that the operands' rounding is the only difference.
//
// Usage: bench_operand_types [--append RESULTS.md]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/dtype.h"
#include "cuda_bench.h"

namespace {

enum class Operand { kBf16, kF16, kTf32, kFp32 };

const char* operand_name(Operand o) {
  switch (o) {
    case Operand::kBf16: return "bf16";
    case Operand::kF16: return "f16";
    case Operand::kTf32: return "TF32";
    case Operand::kFp32: return "fp32";
  }
  return "?";
}

cudaDataType_t data_type(Operand o) {
  return o == Operand::kBf16 ? CUDA_R_16BF : o == Operand::kF16 ? CUDA_R_16F : CUDA_R_32F;
}

// fp32 operands with CUBLAS_COMPUTE_32F multiply in fp32 (TF32 only where asked for by
// CUBLAS_COMPUTE_32F_FAST_TF32).
cublasComputeType_t compute_type(Operand o) {
  return o == Operand::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

size_t element_bytes(Operand o) { return o == Operand::kBf16 || o == Operand::kF16 ? 2 : 4; }

// A device copy of fp32 values in the operand's storage type (TF32 and fp32 keep fp32 bits;
// the product rounds TF32's itself).
struct DeviceMatrix {
  void* data = nullptr;
  DeviceMatrix(const std::vector<float>& values, Operand o) {
    std::vector<uint16_t> narrow;
    const void* src = values.data();
    if (element_bytes(o) == 2) {
      narrow.resize(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        narrow[i] = o == Operand::kBf16 ? dsinfer::f32_to_bf16(values[i]) : dsinfer::f32_to_f16(values[i]);
      }
      src = narrow.data();
    }
    DS_CUDA_CHECK(cudaMalloc(&data, values.size() * element_bytes(o)));
    DS_CUDA_CHECK(cudaMemcpy(data, src, values.size() * element_bytes(o), cudaMemcpyHostToDevice));
  }
  ~DeviceMatrix() { cudaFree(data); }
  DeviceMatrix(const DeviceMatrix&) = delete;
  DeviceMatrix& operator=(const DeviceMatrix&) = delete;
};

// y [rows, out] = x [rows, in] · wᵀ (w [out, in]), all row-major, as the backend's linear
// layers compute it: column-major D (out × rows) = Wᵀᵀ · X, W read transposed.
class Product {
 public:
  Product(cublasLtHandle_t lt, Operand o, int64_t rows, int64_t out, int64_t in, void* workspace,
          size_t workspace_bytes)
      : lt_(lt), workspace_(workspace), workspace_bytes_(workspace_bytes) {
    DS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, compute_type(o), CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T;
    DS_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&w_, data_type(o), in, out, in));
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x_, data_type(o), in, rows, in));
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&y_, CUDA_R_32F, out, rows, out));
    cublasLtMatmulPreference_t preference;
    DS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace_bytes_, sizeof(workspace_bytes_)));
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(lt_, desc_, w_, x_, y_, y_, preference, 1, &heuristic_, &found);
    DS_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
    ok_ = status == CUBLAS_STATUS_SUCCESS && found > 0;  // no algorithm: the row shows 0
  }
  ~Product() {
    cublasLtMatrixLayoutDestroy(y_);
    cublasLtMatrixLayoutDestroy(x_);
    cublasLtMatrixLayoutDestroy(w_);
    cublasLtMatmulDescDestroy(desc_);
  }
  Product(const Product&) = delete;
  Product& operator=(const Product&) = delete;

  bool ok() const { return ok_; }

  void run(const void* x, const void* w, float* y, cudaStream_t stream) const {
    const float one = 1.0f, zero = 0.0f;
    DS_CUBLAS_CHECK(cublasLtMatmul(lt_, desc_, &one, w, w_, x, x_, &zero, y, y_, y, y_, &heuristic_.algo,
                                   workspace_, workspace_bytes_, stream));
  }

 private:
  cublasLtHandle_t lt_;
  void* workspace_;
  size_t workspace_bytes_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t w_ = nullptr, x_ = nullptr, y_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_{};
  bool ok_ = false;
};

std::vector<float> uniform_values(int64_t n, float bound, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-bound, bound);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = dist(gen);
  return v;
}

struct Shape {
  const char* name;
  int64_t rows, out, in;
};

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kGroups = 5;

// FLOP/s of the product: the best of kGroups timed groups after a warm-up, each group about
// 25 ms of back-to-back products.
double product_rate(cublasLtHandle_t lt, Operand o, const Shape& s, void* workspace, float* y, cudaStream_t stream) {
  const DeviceMatrix x(uniform_values(s.rows * s.in, 1.0f, 1), o), w(uniform_values(s.out * s.in, 0.05f, 2), o);
  const Product product(lt, o, s.rows, s.out, s.in, workspace, kWorkspaceBytes);
  if (!product.ok()) return 0;
  const double flops = 2.0 * static_cast<double>(s.rows) * static_cast<double>(s.out) * static_cast<double>(s.in);
  for (int i = 0; i < 3; ++i) product.run(x.data, w.data, y, stream);
  const int reps = static_cast<int>(std::clamp(25e-3 * 5e14 / flops, 3.0, 2000.0));
  cudaEvent_t start, stop;
  DS_CUDA_CHECK(cudaEventCreate(&start));
  DS_CUDA_CHECK(cudaEventCreate(&stop));
  double best_s = 1e30;
  for (int g = 0; g < kGroups; ++g) {
    DS_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < reps; ++i) product.run(x.data, w.data, y, stream);
    DS_CUDA_CHECK(cudaEventRecord(stop, stream));
    DS_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    best_s = std::min(best_s, ms * 1e-3 / reps);
  }
  DS_CUDA_CHECK(cudaEventDestroy(start));
  DS_CUDA_CHECK(cudaEventDestroy(stop));
  return flops / best_s;
}

// The product of x [rows, in] and w [out, in] with operands of type o, to the host.
std::vector<float> product_values(cublasLtHandle_t lt, Operand o, const Shape& s, const std::vector<float>& x_values,
                                  const std::vector<float>& w_values, void* workspace, float* y, cudaStream_t stream) {
  const DeviceMatrix x(x_values, o), w(w_values, o);
  const Product product(lt, o, s.rows, s.out, s.in, workspace, kWorkspaceBytes);
  std::vector<float> out(static_cast<size_t>(s.rows * s.out));
  if (!product.ok()) return {};
  product.run(x.data, w.data, y, stream);
  DS_CUDA_CHECK(cudaMemcpyAsync(out.data(), y, out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
  DS_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string append_path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--append") == 0 && i + 1 < argc) {
      append_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--append FILE]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop;
  if (!dsinfer::bench::first_device(argv[0], prop)) return 1;
  cublasLtHandle_t lt;
  DS_CUBLAS_CHECK(cublasLtCreate(&lt));
  cudaStream_t stream;
  DS_CUDA_CHECK(cudaStreamCreate(&stream));
  void* workspace = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));

  // V2-Lite's products over 16,384 prompt tokens: q_proj (16 heads × 192), o_proj, the shared
  // experts' gate/up (2 × 2 × 1,408) and down; one routed expert's gate/up over its ~1,500 rows.
  const Shape shapes[] = {
      {"8192 × 8192 × 8192", 8192, 8192, 8192},
      {"q_proj, 16,384 × 3,072 × 2,048", 16384, 3072, 2048},
      {"o_proj, 16,384 × 2,048 × 2,048", 16384, 2048, 2048},
      {"shared gate/up, 16,384 × 5,632 × 2,048", 16384, 5632, 2048},
      {"shared down, 16,384 × 2,048 × 2,816", 16384, 2048, 2816},
      {"routed gate/up, 1,536 × 2,816 × 2,048", 1536, 2816, 2048},
  };
  int64_t max_y = 0;
  for (const Shape& s : shapes) max_y = std::max(max_y, s.rows * s.out);
  float* y = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(max_y) * sizeof(float)));

  std::ostringstream table;
  table << "| product (rows × out × in) | bf16 TFLOP/s | f16 TFLOP/s (÷ bf16) | TF32 TFLOP/s (÷ bf16) |\n"
        << "|---|---:|---:|---:|\n";
  for (const Shape& s : shapes) {
    const double bf16 = product_rate(lt, Operand::kBf16, s, workspace, y, stream);
    const double f16 = product_rate(lt, Operand::kF16, s, workspace, y, stream);
    const double tf32 = product_rate(lt, Operand::kTf32, s, workspace, y, stream);
    char row[256];
    std::snprintf(row, sizeof(row), "| %s | %.1f | %.1f (%.3f) | %.1f (%.3f) |\n", s.name, bf16 * 1e-12, f16 * 1e-12,
                  bf16 > 0 ? f16 / bf16 : 0.0, tf32 * 1e-12, bf16 > 0 ? tf32 / bf16 : 0.0);
    table << row;
  }

  // Errors on a 2,048-cube: activations of unit scale, weights of 0.05, against fp32 operands
  // with fp32 arithmetic.
  const Shape error_shape{"2,048³", 2048, 2048, 2048};
  const std::vector<float> x_values = uniform_values(error_shape.rows * error_shape.in, 1.0f, 3);
  const std::vector<float> w_values = uniform_values(error_shape.out * error_shape.in, 0.05f, 4);
  const std::vector<float> reference =
      product_values(lt, Operand::kFp32, error_shape, x_values, w_values, workspace, y, stream);
  table << "\n| operands (2,048³, fp32 sums) | relative RMS error against fp32 operands | ÷ bf16's |\n"
        << "|---|---:|---:|\n";
  double bf16_error = 0;
  for (Operand o : {Operand::kBf16, Operand::kF16, Operand::kTf32}) {
    const std::vector<float> values = product_values(lt, o, error_shape, x_values, w_values, workspace, y, stream);
    if (values.empty() || reference.empty()) {
      table << "| " << operand_name(o) << " | no algorithm for " << (reference.empty() ? "fp32" : operand_name(o))
            << " | |\n";
      continue;
    }
    double diff = 0, norm = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      diff += (static_cast<double>(values[i]) - reference[i]) * (static_cast<double>(values[i]) - reference[i]);
      norm += static_cast<double>(reference[i]) * reference[i];
    }
    const double error = std::sqrt(diff / norm);
    if (o == Operand::kBf16) bf16_error = error;
    char row[160];
    std::snprintf(row, sizeof(row), "| %s | %.3e | %.3f |\n", operand_name(o), error,
                  bf16_error > 0 ? error / bf16_error : 0.0);
    table << row;
  }

  std::ostringstream text;
  text << "\n## Operand types of cuBLASLt's dense product (" << dsinfer::bench::utc_date() << ")\n\n"
       << "Machine: " << prop.name << " (" << prop.multiProcessorCount << " SMs). Command: `build-gpu/"
       << "bench_operand_types`\n\n" << table.str();
  std::printf("%s", text.str().c_str());
  if (!append_path.empty()) dsinfer::bench::append_results(append_path, text.str());
  DS_CUDA_CHECK(cudaFree(y));
  DS_CUDA_CHECK(cudaFree(workspace));
  DS_CUDA_CHECK(cudaStreamDestroy(stream));
  DS_CUBLAS_CHECK(cublasLtDestroy(lt));
  return 0;
}
