#include "backend/cuda/packed_weight.h"

#include "backend/cuda/cuda_backend_state.h"
#include "core/check.h"

namespace dsinfer::cuda {
namespace {
int64_t round_up_to(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
}  // namespace

PackedWeightLayout::PackedWeightLayout(int64_t source_rows, int64_t source_cols, bool is_gate_up, bool is_fp8,
                                       int source_block_rows)
    : rows(source_rows), cols(source_cols), inter(is_gate_up ? source_rows / 2 : 0), gate_up(is_gate_up), fp8(is_fp8) {
  DS_CHECK_MSG(!gate_up || rows % 2 == 0, "gate/up weight with an odd row count " << rows);
  // Whole 128-column tiles (the block-scaled FP8 product works in them), for every dtype alike
  // so that a gate/up's output width is its down projection's input width.
  k_padded = round_up_to(cols, kLibraryFp8TileColumns);
  n_padded = gate_up ? 2 * round_up_to(inter, kLibraryFp8TileColumns) : round_up_to(rows, kGemmTileRows);
  DS_CHECK_MSG(n_padded <= INT32_MAX && k_padded <= INT32_MAX, "weight [" << rows << ", " << cols << "] too large");
  data_bytes = static_cast<size_t>(round_up_to(n_padded * k_padded * (fp8 ? 1 : 2), 256));
  scale_cols = k_padded / 128;
  if (!fp8) return;
  scale_bytes = static_cast<size_t>(round_up_to(n_padded / kPackedScaleRows * scale_cols * 4, 256));
  library_blocks = !gate_up && source_block_rows == 128;
  // Each half must start on a source block too.
  gate_up_halves_blocks = gate_up && source_block_rows == 128 && inter % 128 == 0;
  library_block_cols = round_up_to(scale_cols, 4);
  library_scale_count = library_blocks ? (n_padded + 127) / 128 * library_block_cols : scale_cols * n_padded;
}

}  // namespace dsinfer::cuda
