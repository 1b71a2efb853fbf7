// The forms of the few-row product's blocks and how a launch sizes them: the CUDA-core form
// (few_row_gemm.cuh; bf16 or e4m3 weights, a block takes quads of weight rows) and the
// tensor-core form of e4m3 weights (few_row_mma.cuh; a block takes 32-row tiles and keeps its x
// rows in shared memory). few_row_gemm.cu and moe_routing_beside.cu launch either.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/few_row_gemm.cuh"
#include "backend/cuda/few_row_mma.cuh"
#include "backend/cuda/few_row_phases.h"

namespace dsinfer::cuda::few_row {

// Bound of the tensor-core form's x rows in shared memory (beyond it the CUDA-core form runs).
constexpr size_t kMmaMaxSharedBytes = 40 * 1024;

// A block form: kTokens rows a pass, e4m3 or bf16 weights, tensor cores or CUDA cores, and for
// the CUDA-core forms a phase count fixed at compile time (gemm_block; 0: read at run time) and,
// for one row, whether x's row is read in fp32 (kXF32: GroupedGemmArgs::x_f32).
// A block takes up to kMaxUnitsPerBlock consecutive units of kUnitRows weight rows.
template <int kTokens, bool kFp8, bool kMma, int kFixedPhases = 0, bool kXF32 = false>
struct Form {
  static_assert(!kMma || kFp8, "the tensor-core form takes e4m3 weights");
  static_assert(!kMma || kFixedPhases == 0, "the tensor-core form walks chunks, not phases");
  static_assert(!kXF32 || (kTokens == 1 && !kMma), "fp32 rows: one row on CUDA cores");
  static constexpr int kUnitRows = kMma ? kGemmTileRows : kQuadRows;
  static constexpr int kMaxUnitsPerBlock = kMma ? kMmaMaxTilesPerBlock : kMaxQuadsPerBlock;
  // Blocks an SM that the kernels running it are compiled for (__launch_bounds__; 0: no bound).
  // The CUDA-core forms of one row: four, at most 128 registers a thread (left free, their
  // registers drift above 128 with the code around them, and three blocks fit an SM). The
  // other forms need more registers than four blocks leave them, or sit at 128 already.
  static constexpr int kMinBlocksPerSm = kTokens == 1 && !kMma ? 4 : 0;
  static size_t shared_bytes(const GroupedGemmArgs& a) { return kMma ? mma_shared_bytes<kTokens>(a.ldx) : 0; }
  __device__ static void run(const GroupedGemmArgs& a, int units_per_block, int block_x, int row_block) {
    if constexpr (kMma) gemm_block_mma<kTokens>(a, units_per_block, block_x, row_block);
    else gemm_block<kTokens, kFp8, kFixedPhases, kXF32>(a, units_per_block, block_x, row_block);
  }
  // A Kernel running the tensor-core form may take up to kMmaMaxSharedBytes of x rows beside its
  // own static shared memory (the routing's, in moe_routing_beside.cu), past the 48 KB a launch
  // gets by default.
  template <auto Kernel>
  static void allow_shared_memory() {
    if constexpr (kMma) allow_shared_bytes<Kernel>(kMmaMaxSharedBytes);
  }
};

// Blocks of a kernel of kThreads threads with shared_bytes of dynamic shared memory that fit on
// the GPU at once (the last size asked for is remembered; callers of one kernel mostly ask for
// one size).
template <auto Kernel>
int resident_blocks(size_t shared_bytes) {
  static std::atomic<uint64_t> last{0};  // shared_bytes << 32 | blocks; blocks 0: none yet
  const uint64_t seen = last.load(std::memory_order_relaxed);
  if ((seen & 0xffffffffu) != 0 && seen >> 32 == shared_bytes) return static_cast<int>(seen & 0xffffffffu);
  int per_sm = 0;
  DS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, kThreads, shared_bytes));
  const int blocks = std::max(1, device_multiprocessors() * per_sm);
  last.store(static_cast<uint64_t>(shared_bytes) << 32 | static_cast<uint32_t>(blocks), std::memory_order_relaxed);
  return blocks;
}

// Units per block that make a product of num_units units per row-block, over num_row_blocks
// row-blocks, one wave of `capacity` resident blocks (so that no block waits for another to
// finish, and each block's lookups and sums are shared by several units), within the bound of the
// block's sums.
inline int units_per_block(int num_units, int num_row_blocks, int64_t capacity, int max_units_per_block) {
  const int64_t work = static_cast<int64_t>(num_units) * num_row_blocks;
  return static_cast<int>(std::clamp<int64_t>((work + capacity - 1) / capacity, 1, max_units_per_block));
}

// One wave of Kernel's blocks of Form (units_per_block) over a product of max_n_padded weight rows
// and max_row_blocks row-blocks: the grid (blocks of units × row-blocks), the units a block, and
// the shared memory a block, which the kernel is allowed.
struct OneWave {
  dim3 grid;
  int units_per_block = 0;
  size_t shared_bytes = 0;
};
template <typename Form, auto Kernel>
OneWave one_wave(const GroupedGemmArgs& a, int max_n_padded, int max_row_blocks) {
  OneWave w;
  w.shared_bytes = Form::shared_bytes(a);
  Form::template allow_shared_memory<Kernel>();
  const int num_units = max_n_padded / Form::kUnitRows;
  w.units_per_block = units_per_block(num_units, max_row_blocks, resident_blocks<Kernel>(w.shared_bytes),
                                      Form::kMaxUnitsPerBlock);
  w.grid = dim3((num_units + w.units_per_block - 1) / w.units_per_block, max_row_blocks);
  return w;
}

static_assert(kPiecesPerPhase == kThreads, "a phase is one piece a thread (few_row_phases.h)");

// with_block_form's CUDA-core forms of x's rows in bf16, or in fp32 (kXF32) (a function, not a
// lambda: the compiler instantiated the discarded branches of a generic lambda's `if constexpr`).
template <int kTokens, bool kFp8, bool kXF32, int kMaxFixedPhases, int kMaxFp8FixedPhases, typename F>
void with_cuda_core_form_of_rows(const GroupedGemmArgs& a, F& f) {
  if constexpr (kTokens <= 2) {
    const int phases =
        a.few_row_fixed_phases ? fixed_phases(a.ldx, kFp8, kMaxFixedPhases, kMaxFp8FixedPhases) : 0;
    if (phases == 1) return f(Form<kTokens, kFp8, false, 1, kXF32>{});
    if (phases == 2) return f(Form<kTokens, kFp8, false, 2, kXF32>{});
    if constexpr ((kFp8 ? kMaxFp8FixedPhases : kMaxFixedPhases) >= 4)
      if (phases == 4) return f(Form<kTokens, kFp8, false, 4, kXF32>{});
  }
  f(Form<kTokens, kFp8, false, 0, kXF32>{});
}

template <int kTokens, bool kFp8, int kMaxFixedPhases, int kMaxFp8FixedPhases, typename F>
void with_cuda_core_form(const GroupedGemmArgs& a, F& f) {
  if constexpr (kTokens == 1) {
    if (a.x_f32 != nullptr)
      return with_cuda_core_form_of_rows<kTokens, kFp8, true, kMaxFixedPhases, kMaxFp8FixedPhases>(a, f);
  }
  with_cuda_core_form_of_rows<kTokens, kFp8, false, kMaxFixedPhases, kMaxFp8FixedPhases>(a, f);
}

// Where a product may read x's rows in fp32 (GroupedGemmArgs::x_f32) and write fp32 SiLU·up rows.
inline void check_f32_rows(const GroupedGemmArgs& a, int max_rows_per_block) {
  DS_CHECK_MSG(a.x_f32 == nullptr || (max_rows_per_block <= 1 && !(a.weights_fp8 && a.few_row_mma) &&
                                      a.x_f32_cols % 8 == 0 && a.ldx_f32 % 4 == 0 && a.x_f32_cols <= a.ldx &&
                                      reinterpret_cast<uintptr_t>(a.x_f32) % 16 == 0),
               "few-row GEMM: fp32 rows are read by passes of one row on CUDA cores, 8 columns at a time");
  DS_CHECK_MSG(a.epilogue != GemmEpilogue::kSiluMulF32 || !(a.weights_fp8 && a.few_row_mma),
               "few-row GEMM: fp32 SiLU·up rows come from the CUDA-core forms");
}

// Calls f(Form<kTokens, kFp8, kMma, kFixedPhases>{}) with the rows a block handles together for
// row-blocks of up to max_rows_per_block rows (1, 2 or 4; they never change the result), the
// weight type, the tensor-core form where a.few_row_mma asks for it for e4m3 weights and their x
// rows fit, and for CUDA-core blocks of one or two rows the phases fixed where
// a.few_row_fixed_phases asks for it and fixed_phases allows, up to kMaxFixedPhases (2 or 4) for
// bf16 weights and kMaxFp8FixedPhases for e4m3 ones.
template <int kMaxFixedPhases = 4, int kMaxFp8FixedPhases = 4, typename F>
void with_block_form(const GroupedGemmArgs& a, int max_rows_per_block, F&& f) {
  // StepDivisor's quotients are exact for K below kStepDivisorMaxK (K is at most x's row stride).
  DS_CHECK_MSG(a.ldx < kStepDivisorMaxK, "few-row GEMM: rows of " << a.ldx << " columns are beyond its step counts");
  check_f32_rows(a, max_rows_per_block);
  const auto with_type = [&](auto tokens) {
    constexpr int kTokens = decltype(tokens)::value;
    if (a.weights_fp8 && a.few_row_mma && mma_shared_bytes<kTokens>(a.ldx) <= kMmaMaxSharedBytes)
      f(Form<kTokens, true, true>{});
    else if (a.weights_fp8) with_cuda_core_form<kTokens, true, kMaxFixedPhases, kMaxFp8FixedPhases>(a, f);
    else with_cuda_core_form<kTokens, false, kMaxFixedPhases, kMaxFp8FixedPhases>(a, f);
  };
  if (max_rows_per_block <= 1) with_type(std::integral_constant<int, 1>{});
  else if (max_rows_per_block <= 2) with_type(std::integral_constant<int, 2>{});
  else with_type(std::integral_constant<int, 4>{});
}

}  // namespace dsinfer::cuda::few_row
