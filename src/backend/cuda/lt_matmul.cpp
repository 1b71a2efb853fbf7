#include "backend/cuda/lt_matmul.h"

#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/logging.h"

namespace dsinfer::cuda {

namespace {

// The heuristic's first max_count algorithms for the product `desc` over layouts a, b, c, d
// (fewer when it knows fewer); returns its status.
int heuristic_algorithms(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                         cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                         size_t workspace_bytes, uint32_t alignment_bytes, int max_count,
                         std::vector<cublasLtMatmulHeuristicResult_t>& results) {
  cublasLtMatmulPreference_t pref;
  DS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_bytes, sizeof workspace_bytes));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &alignment_bytes, sizeof alignment_bytes));
  results.assign(max_count, cublasLtMatmulHeuristicResult_t{});
  int count = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, d, pref, max_count, results.data(), &count);
  cublasLtMatmulPreferenceDestroy(pref);
  results.resize(st == CUBLAS_STATUS_SUCCESS ? count : 0);
  return static_cast<int>(st);
}

}  // namespace

struct LtMatmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  bool timed = false;      // algo is the fastest of the heuristic's candidates (tune_max_rows)
  uint32_t alignment = 0;  // the operand alignment the heuristic was asked for
  int64_t rows = 0;        // m the layouts b, c and d describe now
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

LtMatmul::LtMatmul(Stream stream, int64_t tune_max_rows) : stream_(stream), tune_max_rows_(tune_max_rows) {
  DS_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_bytes_ = size_t{32} << 20;
  DS_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  DS_CUDA_CHECK(cudaMalloc(&placeholder_scales_, 4096));
}

LtMatmul::~LtMatmul() {
  plans_.clear();
  exact_plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (placeholder_scales_) cudaFree(placeholder_scales_);
  if (handle_) cublasLtDestroy(handle_);
}

int LtMatmul::pick_algorithm(Plan* p, uint32_t alignment_bytes) {
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  const int st =
      heuristic_algorithms(handle_, p->desc, p->a, p->b, p->c, p->d, workspace_bytes_, alignment_bytes, 1, results);
  p->ok = !results.empty();
  p->alignment = alignment_bytes;
  if (p->ok) p->algo = results[0].algo;
  return st;
}

// Runs each of the heuristic's first kTuneCandidates algorithms on the product's own operands
// (the caller's run overwrites y afterwards) and keeps the fastest. The heuristic's first
// choice is among them, so the plan never gets slower than untuned, up to the timing's noise.
// Not while the stream is being captured into a graph: timing needs the host to wait. Such a
// plan keeps the heuristic's choice until a product of its shape runs outside a capture. Nor
// for a product in place, whose trial runs would change its input.
void LtMatmul::time_candidates(Plan* p, const void* w, const void* x, void* y, const float* w_scales,
                               const float* x_scales) {
  if (y == x || y == w) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  DS_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  if (capture != cudaStreamCaptureStatusNone) return;
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  heuristic_algorithms(handle_, p->desc, p->a, p->b, p->c, p->d, workspace_bytes_, p->alignment, kTuneCandidates,
                       results);
  cudaEvent_t begin, end;
  DS_CUDA_CHECK(cudaEventCreate(&begin));
  DS_CUDA_CHECK(cudaEventCreate(&end));
  const cublasLtMatmulAlgo_t chosen = p->algo;
  cublasLtMatmulAlgo_t best = chosen;
  float best_ms = 0.0f, first_ms = 0.0f;
  bool found = false;
  size_t best_index = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const cublasLtMatmulHeuristicResult_t& r = results[i];
    p->algo = r.algo;
    if (run(p, w, x, y, w_scales, x_scales) != CUBLAS_STATUS_SUCCESS) continue;  // also the warm-up
    DS_CUDA_CHECK(cudaEventRecord(begin, stream_));
    bool ran = true;
    for (int rep = 0; rep < kTuneRepeats && ran; ++rep)
      ran = run(p, w, x, y, w_scales, x_scales) == CUBLAS_STATUS_SUCCESS;
    DS_CUDA_CHECK(cudaEventRecord(end, stream_));
    DS_CUDA_CHECK(cudaEventSynchronize(end));
    float ms = 0.0f;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
    if (ran && i == 0) first_ms = ms;
    if (ran && (!found || ms < best_ms)) {
      best_ms = ms;
      best = r.algo;
      best_index = i;
      found = true;
    }
  }
  if (found)
    DS_LOG_DEBUG("cuda: cuBLASLt tuning, " << p->rows << " rows: candidate " << best_index << " of "
                                          << results.size() << ", " << 1000.0f * best_ms / kTuneRepeats
                                          << " us against the heuristic's " << 1000.0f * first_ms / kTuneRepeats
                                          << " us");
  DS_CUDA_CHECK(cudaEventDestroy(begin));
  DS_CUDA_CHECK(cudaEventDestroy(end));
  p->algo = found ? best : chosen;
  p->timed = true;
}

std::unique_ptr<LtMatmul::Plan> LtMatmul::make_plan(Kind kind, int64_t m, int64_t n, int64_t k, int* status) {
  auto p = std::make_unique<Plan>();
  const bool fp8 = is_fp8(kind);
  const cudaDataType_t ab_type = kind == Kind::kF32 ? CUDA_R_32F : fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  const cudaDataType_t y_type = writes_bf16(kind) ? CUDA_R_16BF : CUDA_R_32F;
  DS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t));
  DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
  if (fp8) {
    // A is the weight, B the activations (see the header for both scale layouts).
    const bool blocks = kind == Kind::kFp8Blocks || kind == Kind::kFp8BlocksToBf16;
    const cublasLtMatmulMatrixScale_t a_mode =
        blocks ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode));
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode));
    // Block scaling modes need scale pointers to be set already when the heuristic is asked
    // (it answers "no algorithm" otherwise); the real ones are set before every run.
    const void* placeholder = placeholder_scales_;
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder,
                                                   sizeof placeholder));
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder,
                                                   sizeof placeholder));
  }
  // A = W viewed column-major [k, n]; B = x viewed column-major [k, m]; D column-major [n, m]
  // = y row-major.
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab_type, k, n, k));
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab_type, k, m, k));
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, y_type, n, m, n));
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, y_type, n, m, n));
  // bf16 and fp32: 16-byte aligned operands, not the 256 bytes the heuristic assumes by default
  // (per-expert row slices of one buffer start anywhere on a row boundary). FP8 operands are
  // whole allocations.
  *status = pick_algorithm(p.get(), fp8 ? kFp8AlignmentBytes : kMinAlignmentBytes);
  return p;
}

// The row count a plan's algorithm is chosen for: m itself up to kExactPlanRows rows, above
// that m rounded up to a multiple of kPlanRowsStep. Prefill-sized MoE layers run one product
// per expert, and the experts' row counts change with every step's routing: a plan per exact m
// would ask cuBLASLt's heuristic again for nearly every product (and keep every answer). The
// algorithm chosen for the rounded count runs the counts below it in the same tiles.
int64_t LtMatmul::plan_rows(int64_t m) {
  return m <= kExactPlanRows ? m : (m + kPlanRowsStep - 1) / kPlanRowsStep * kPlanRowsStep;
}

LtMatmul::Plan* LtMatmul::find_plan(Kind kind, int64_t rows, int64_t n, int64_t k,
                                    std::map<PlanKey, std::unique_ptr<Plan>>& plans) {
  const PlanKey key(static_cast<int>(kind), rows, n, k);
  auto it = plans.find(key);
  if (it == plans.end()) {
    int status = 0;
    it = plans.emplace(key, make_plan(kind, rows, n, k, &status)).first;
    it->second->rows = rows;
    if (!it->second->ok && is_fp8(kind))
      DS_LOG_INFO("cuda: cuBLASLt has no block-scaled FP8 algorithm for m=" << rows << " n=" << n << " k=" << k
                                                                            << " (status " << status << ")");
  }
  return it->second.get();
}

LtMatmul::Plan* LtMatmul::plan(Kind kind, int64_t m, int64_t n, int64_t k, bool must_exist) {
  Plan* p = find_plan(kind, plan_rows(m), n, k, plans_);
  DS_CHECK_MSG(p->ok || !must_exist, "cuBLASLt has no algorithm for kind " << static_cast<int>(kind) << " m=" << m
                                                                          << " n=" << n << " k=" << k);
  set_rows(p, m);
  return p;
}

void LtMatmul::set_rows(Plan* p, int64_t m) {
  if (p->rows == m) return;
  // Column-major views: B = x is [k, m], C and D are [n, m]; m is their column count.
  const uint64_t cols = static_cast<uint64_t>(m);
  for (cublasLtMatrixLayout_t layout : {p->b, p->c, p->d})
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
  p->rows = m;
}

// Runs y = x · Wᵀ for m rows on the plan of m's rounded row count; should cuBLASLt turn that
// algorithm down for m itself, on a plan chosen for exactly m (kept apart, in a bounded cache).
int LtMatmul::run_rows(Kind kind, int64_t m, int64_t n, int64_t k, const void* w, const void* x, void* y,
                       const float* w_scales, const float* x_scales) {
  Plan* p = plan(kind, m, n, k, true);
  if (!p->timed && plan_rows(m) <= tune_max_rows_) time_candidates(p, w, x, y, w_scales, x_scales);
  const int st = run(p, w, x, y, w_scales, x_scales);
  if (st != CUBLAS_STATUS_NOT_SUPPORTED || plan_rows(m) == m) return st;
  if (exact_plans_.size() >= kMaxExactPlans) exact_plans_.clear();
  Plan* exact = find_plan(kind, m, n, k, exact_plans_);
  if (!exact->ok) return st;
  return run(exact, w, x, y, w_scales, x_scales);
}

int LtMatmul::run(Plan* p, const void* a, const void* b, void* d, const float* a_scales, const float* b_scales) {
  if (a_scales != nullptr) {
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scales,
                                                   sizeof a_scales));
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scales,
                                                   sizeof b_scales));
  }
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(handle_, p->desc, &alpha, a, p->a, b, p->b, &beta, d, p->c, d, p->d, &p->algo, workspace_,
                        workspace_bytes_, stream_);
}

void LtMatmul::bf16(const uint16_t* w, const uint16_t* x, void* y, int64_t m, int64_t n, int64_t k, bool y_bf16) {
  if (m == 0 || n == 0) return;
  const int st = run_rows(y_bf16 ? Kind::kBf16ToBf16 : Kind::kBf16, m, n, k, w, x, y, nullptr, nullptr);
  DS_CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "cublasLtMatmul (bf16): status " << st);
}

// Column-major, cuBLASLt sees yᵀ (n x m, ld_y) = op(A) · B with B = xᵀ (k x m, ld_x) and
// A = w: stored k x n and transposed when w's rows are n, else stored n x k as it is.
std::unique_ptr<LtMatmul::Plan> LtMatmul::make_strided_plan(const Strided& s) {
  auto p = std::make_unique<Plan>();
  DS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = s.w_rows_are_n ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  const cudaDataType_t y_type = s.y_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  if (s.w_rows_are_n)
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, s.k, s.n, s.ld_w));
  else
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, s.n, s.k, s.ld_w));
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, s.k, s.m, s.ld_x));
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, y_type, s.n, s.m, s.ld_y));
  DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, y_type, s.n, s.m, s.ld_y));
  if (s.batch > 1 || s.pointer_array) {
    const int32_t count = s.batch;
    const uint32_t mode = s.pointer_array ? CUBLASLT_BATCH_MODE_POINTER_ARRAY : CUBLASLT_BATCH_MODE_STRIDED;
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {
        {p->a, s.stride_w}, {p->b, s.stride_x}, {p->c, s.stride_y}, {p->d, s.stride_y}};
    for (const auto& [layout, stride] : layouts) {
      DS_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      if (s.pointer_array)
        DS_CUBLAS_CHECK(
            cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode));
      else
        DS_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                         sizeof stride));
    }
  }
  const int st = pick_algorithm(p.get(), kMinAlignmentBytes);
  if (!p->ok)
    DS_LOG_INFO("cuda: cuBLASLt has no algorithm for the batched product m="
                << s.m << " n=" << s.n << " k=" << s.k << " batch=" << s.batch
                << (s.pointer_array ? " (pointer arrays)" : "") << " (status " << st << ")");
  return p;
}

LtMatmul::Plan* LtMatmul::strided_plan(const Strided& s) {
  auto it = strided_plans_.find(s.key());
  if (it == strided_plans_.end()) {
    // Attention products take their shapes from context lengths: keep the cache bounded.
    if (strided_plans_.size() >= kMaxStridedPlans) strided_plans_.clear();
    it = strided_plans_.emplace(s.key(), make_strided_plan(s)).first;
  }
  return it->second.get();
}

void LtMatmul::bf16_strided(const Strided& s, const uint16_t* x, const uint16_t* w, void* y) {
  if (s.m == 0 || s.n == 0 || s.batch == 0) return;
  const size_t y_elem = s.y_bf16 ? 2 : 4;
  const auto aligned = [](uintptr_t v) { return v % kMinAlignmentBytes == 0; };
  DS_CHECK_MSG(aligned(reinterpret_cast<uintptr_t>(x)) && aligned(reinterpret_cast<uintptr_t>(w)) &&
                   aligned(reinterpret_cast<uintptr_t>(y)) && aligned(s.ld_x * 2) && aligned(s.ld_w * 2) &&
                   aligned(s.ld_y * y_elem) && aligned(s.stride_x * 2) && aligned(s.stride_w * 2) &&
                   aligned(s.stride_y * y_elem),
               "strided product: operands must be aligned to " << kMinAlignmentBytes << " bytes");
  DS_CHECK(!s.pointer_array);
  Plan* p = strided_plan(s);
  DS_CHECK_MSG(p->ok, "cuBLASLt has no algorithm for the strided product m=" << s.m << " n=" << s.n << " k=" << s.k
                                                                              << " batch=" << s.batch);
  const int st = run(p, w, x, y, nullptr, nullptr);
  DS_CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "cublasLtMatmul (strided bf16): status " << st);
}

bool LtMatmul::pointer_array_ready(const Strided& s) {
  DS_CHECK(s.pointer_array && s.w_rows_are_n);
  return s.m > 0 && s.n > 0 && s.batch > 0 && strided_plan(s)->ok;
}

void LtMatmul::bf16_pointer_array(const Strided& s, const void* const* x, const void* const* w, void* const* y) {
  DS_CHECK(s.pointer_array && s.w_rows_are_n);
  if (s.m == 0 || s.n == 0 || s.batch == 0) return;
  const size_t y_elem = s.y_bf16 ? 2 : 4;
  const auto aligned = [](uintptr_t v) { return v % kMinAlignmentBytes == 0; };
  DS_CHECK_MSG(aligned(s.ld_x * 2) && aligned(s.ld_w * 2) && aligned(s.ld_y * y_elem),
               "pointer-array product: leading dimensions must be multiples of " << kMinAlignmentBytes << " bytes");
  Plan* p = strided_plan(s);
  DS_CHECK_MSG(p->ok, "cuBLASLt has no pointer-array algorithm for m=" << s.m << " n=" << s.n << " k=" << s.k
                                                                       << " batch=" << s.batch);
  const int st = run(p, w, x, const_cast<void*>(static_cast<const void*>(y)), nullptr, nullptr);
  DS_CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "cublasLtMatmul (pointer-array bf16): status " << st);
}

void LtMatmul::f32(const float* w, const float* x, float* y, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  const int st = run_rows(Kind::kF32, m, n, k, w, x, y, nullptr, nullptr);
  DS_CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "cublasLtMatmul (fp32): status " << st);
}

bool LtMatmul::fp8_ready(int64_t m, int64_t n, int64_t k, Fp8WeightScales w_scales_mode, bool y_bf16) {
  if (m <= 0 || n <= 0 || m % 4 != 0 || n % 4 != 0 || k % 128 != 0) return false;
  return plan(fp8_kind(w_scales_mode, y_bf16), m, n, k, false)->ok;
}

void LtMatmul::fp8(const uint8_t* w, const float* w_scales, Fp8WeightScales w_scales_mode, const uint8_t* x,
                   const float* x_scales, void* y, int64_t m, int64_t n, int64_t k, bool y_bf16) {
  DS_CHECK(m % 4 == 0 && n % 4 == 0 && k % 128 == 0);
  for (const void* ptr : {static_cast<const void*>(w), static_cast<const void*>(w_scales),
                          static_cast<const void*>(x), static_cast<const void*>(x_scales), static_cast<const void*>(y)})
    DS_CHECK_MSG(reinterpret_cast<uintptr_t>(ptr) % kFp8AlignmentBytes == 0,
                 "FP8 product: operands must be aligned to " << kFp8AlignmentBytes << " bytes");
  const int st = run_rows(fp8_kind(w_scales_mode, y_bf16), m, n, k, w, x, y, w_scales, x_scales);
  DS_CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "cublasLtMatmul (FP8 block-scaled): status " << st);
}

}  // namespace dsinfer::cuda
