// cuBLASLt matrix products of the CUDA backend, all in one orientation: y = x · Wᵀ with W
// [n, k] and x [m, k] row-major, y [m, n] row-major. In cuBLASLt's column-major terms that is
// D[n, m] = op(A)=Wᵀ-transposed · B, i.e. the "TN" layout, which is also the only one its FP8
// matmul accepts. Plans (descriptors + heuristic algorithm) are cached per shape, with row
// counts above 128 rounded up to a multiple of 32 (plan_rows).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "backend/cuda/cuda_kernels.h"

struct cublasLtContext;

namespace dsinfer::cuda {

class LtMatmul {
 public:
  // Every pointer handed to LtMatmul must be aligned to this many bytes.
  static constexpr uintptr_t kMinAlignmentBytes = 16;
  // ... and every operand of an FP8 product to this many.
  static constexpr uintptr_t kFp8AlignmentBytes = 256;

  // Products of up to tune_max_rows rows (after plan_rows' rounding) time the heuristic's first
  // few algorithms on their first run outside a graph capture and keep the fastest; 0 keeps the
  // heuristic's first choice everywhere.
  explicit LtMatmul(Stream stream, int64_t tune_max_rows = 0);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // bf16 W and x, fp32 accumulate, fp32 y (bf16 y where y_bf16).
  void bf16(const uint16_t* w, const uint16_t* x, void* y, int64_t m, int64_t n, int64_t k, bool y_bf16 = false);
  // Row-major products with explicit leading dimensions, batched with strides (all counted in
  // elements): y[b] (m x n) = x[b] (m x k) · w[b]ᵀ when w_rows_are_n (w[b] is [n, k]), else
  // x[b] · w[b] (w[b] is [k, n]). bf16 x and w, fp32 accumulate, y fp32 or bf16. Pointers and
  // the byte size of every leading dimension and stride must be multiples of 16.
  using StridedKey = std::tuple<int64_t, int64_t, int64_t, int, bool, bool, int64_t, int64_t, int64_t, int64_t,
                                int64_t, int64_t, bool>;
  struct Strided {
    int64_t m = 0, n = 0, k = 0;
    int batch = 1;
    bool w_rows_are_n = true;
    bool y_bf16 = false;
    int64_t ld_x = 0, ld_w = 0, ld_y = 0;
    int64_t stride_x = 0, stride_w = 0, stride_y = 0;
    // The batch's operands are found through device arrays of pointers, one per batch entry
    // (bf16_pointer_array); the strides are then unused.
    bool pointer_array = false;
    StridedKey key() const {
      return StridedKey(m, n, k, batch, w_rows_are_n, y_bf16, ld_x, ld_w, ld_y, stride_x, stride_w, stride_y,
                        pointer_array);
    }
  };
  void bf16_strided(const Strided& shape, const uint16_t* x, const uint16_t* w, void* y);
  // The same products with each batch entry's x, w and y read from device arrays of `batch`
  // pointers (shape.pointer_array set; every pointer 16-byte aligned). pointer_array_ready says
  // whether cuBLASLt has an algorithm for the shape (plans are cached); run only when it does.
  bool pointer_array_ready(const Strided& shape);
  void bf16_pointer_array(const Strided& shape, const void* const* x, const void* const* w, void* const* y);
  // fp32 throughout (the router: expert choice is sensitive to rounding).
  void f32(const float* w, const float* x, float* y, int64_t m, int64_t n, int64_t k);
  // How an e4m3 weight's scales are laid out for LtMatmul::fp8.
  enum class Fp8WeightScales {
    kBlocks128x128,  // one per 128x128 block: [ceil(n/128)][k/128 rounded up to 4], k-blocks contiguous
    kRows1x128,      // one per (row, 128 columns): [k/128][n], rows contiguous
  };
  // DeepSeek's FP8 recipe: y [m, n] = x · Wᵀ with W e4m3 [n, k] (scales as w_scales_mode says)
  // and x e4m3 [m, k] with one fp32 scale per (row, 128 columns), laid out [k/128][m] (rows
  // contiguous); y fp32, or bf16 with y_bf16 (the sums are fp32 either way). m and n multiples
  // of 4, k of 128, every pointer aligned to kFp8AlignmentBytes. fp8_ready says whether cuBLASLt
  // has an algorithm for the shape and output (plans are cached); fp8 must only run when it does.
  bool fp8_ready(int64_t m, int64_t n, int64_t k, Fp8WeightScales w_scales_mode, bool y_bf16 = false);
  void fp8(const uint8_t* w, const float* w_scales, Fp8WeightScales w_scales_mode, const uint8_t* x,
           const float* x_scales, void* y, int64_t m, int64_t n, int64_t k, bool y_bf16 = false);

 private:
  struct Plan;
  enum class Kind { kBf16, kBf16ToBf16, kF32, kFp8Blocks, kFp8Rows, kFp8BlocksToBf16, kFp8RowsToBf16 };
  static bool is_fp8(Kind kind) {
    return kind == Kind::kFp8Blocks || kind == Kind::kFp8Rows || kind == Kind::kFp8BlocksToBf16 ||
           kind == Kind::kFp8RowsToBf16;
  }
  static bool writes_bf16(Kind kind) {
    return kind == Kind::kBf16ToBf16 || kind == Kind::kFp8BlocksToBf16 || kind == Kind::kFp8RowsToBf16;
  }
  static Kind fp8_kind(Fp8WeightScales w_scales_mode, bool y_bf16) {
    if (w_scales_mode == Fp8WeightScales::kBlocks128x128) return y_bf16 ? Kind::kFp8BlocksToBf16 : Kind::kFp8Blocks;
    return y_bf16 ? Kind::kFp8RowsToBf16 : Kind::kFp8Rows;
  }
  using PlanKey = std::tuple<int, int64_t, int64_t, int64_t>;
  static constexpr int64_t kExactPlanRows = 128;
  // Steps of 32 rows: the 200-prompt workload ran as fast as with steps of 128 (43.40 against
  // 43.37 requests/s), and the 4 x 4k prefill, whose repeated passes route alike and so meet the
  // same row counts, lost less against exact plans (78.2k and 77.3k tok/s against 79.1k).
  static constexpr int64_t kPlanRowsStep = 32;
  static constexpr size_t kMaxExactPlans = 256;
  static int64_t plan_rows(int64_t m);
  Plan* find_plan(Kind kind, int64_t rows, int64_t n, int64_t k, std::map<PlanKey, std::unique_ptr<Plan>>& plans);
  // The plan of m's rounded row count, its layouts set to m rows.
  Plan* plan(Kind kind, int64_t m, int64_t n, int64_t k, bool must_exist);
  void set_rows(Plan* p, int64_t m);
  int run_rows(Kind kind, int64_t m, int64_t n, int64_t k, const void* w, const void* x, void* y,
               const float* w_scales, const float* x_scales);
  std::unique_ptr<Plan> make_plan(Kind kind, int64_t m, int64_t n, int64_t k, int* status);
  // Asks the heuristic for p's algorithm (p->ok, p->algo); returns cuBLASLt's status.
  int pick_algorithm(Plan* p, uint32_t alignment_bytes);
  static constexpr int kTuneCandidates = 8;
  static constexpr int kTuneRepeats = 5;
  // Sets p->algo to the fastest of the heuristic's candidates on these operands (p->timed).
  void time_candidates(Plan* p, const void* w, const void* x, void* y, const float* w_scales, const float* x_scales);
  // Returns cuBLASLt's status (cublasStatus_t).
  int run(Plan* p, const void* a, const void* b, void* d, const float* a_scales, const float* b_scales);

  Stream stream_;
  int64_t tune_max_rows_ = 0;
  cublasLtContext* handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* placeholder_scales_ = nullptr;
  static constexpr size_t kMaxStridedPlans = 1024;
  std::unique_ptr<Plan> make_strided_plan(const Strided& s);
  Plan* strided_plan(const Strided& s);
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
  // Plans for exact row counts whose rounded plan cuBLASLt turned down (bounded).
  std::map<PlanKey, std::unique_ptr<Plan>> exact_plans_;
  std::map<StridedKey, std::unique_ptr<Plan>> strided_plans_;
};

}  // namespace dsinfer::cuda
