// How many K phases the few-row kernel's CUDA-core blocks walk with the count fixed at compile
// time (few_row_gemm.cuh, gemm_block), as a host rule that few_row_form.cuh applies and the host
// tests check. A phase is 128 pieces of 16 bytes: 1,024 bf16 columns or 2,048 e4m3 ones.
#pragma once

#include <cstdint>

namespace dsinfer::cuda::few_row {

constexpr int kPiecesPerPhase = 128;  // one 16-byte piece a thread of the block

// 1 or 2, or 3 walked as 4 (the fourth empty) or 4: for bf16 weights within max_phases, for e4m3
// ones within max_fp8_phases; else 0 (the run-time walk). e4m3 forms of three or four phases
// keep their x pieces in shared memory instead of registers: up to 32 KB a block, which a kernel
// with large shared memory of its own may not have.
inline int fixed_phases(int64_t ldx, bool fp8, int max_phases, int max_fp8_phases) {
  const int64_t phases = (ldx / (fp8 ? 16 : 8) + kPiecesPerPhase - 1) / kPiecesPerPhase;
  const int64_t fixed = phases == 3 ? 4 : phases;
  return fixed <= (fp8 ? max_fp8_phases : max_phases) ? static_cast<int>(fixed) : 0;
}

}  // namespace dsinfer::cuda::few_row
