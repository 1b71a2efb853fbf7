// The per-head products of absorbed MLA attention on tensor cores, for steps of 16 tokens or
// more: y[t, h, :] = x[t, h, :] · w[h] (q_nope · W_UK into the latent queries, the latent
// output · W_UVᵀ out of them), both fp32 in memory.
//
// The fp32 kernel beside it (cuda_attention.cu) spends most of its time waiting on one weight
// load per k and lane: at a batch of 256 the two products took 64 µs of a 600 µs layer for some
// 25 MB of traffic. Here a block owns 32 tokens × 128 columns of one head and streams k in
// steps of 32 through five shared-memory stages (cp.async), x rows and weight rows alike; its
// eight warps (2 × 4, 16 tokens × 32 columns each) multiply in TF32, operands rounded to
// nearest, sums in fp32: the precision the head tiles' scores already have.
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/tensor_core.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 32;    // tokens of a block
constexpr int kCols = 128;   // output columns of a block
constexpr int kStageK = 32;  // k of a stage
// Five stages, 110 KB: two blocks fit on an SM, and the W_UV product (k = 512, one block per SM
// at a batch of 256) keeps four stages in flight. With three, FP8 decode at batch 256 was 1.3%
// slower.
constexpr int kStages = 5;
// Floats per row in shared memory, chosen so that a warp's fragment loads meet 32 banks: x rows
// 4 past a multiple of 32 (lanes read rows g, columns tq), weight rows 8 past (rows tq, columns g).
constexpr int kLdX = kStageK + 4;
constexpr int kLdW = kCols + 8;

struct Stage {
  float x[kRows][kLdX];    // x[t0 + r, h, k0 + c]
  float w[kStageK][kLdW];  // w[h, k0 + r, col0 + c]
};
constexpr size_t kSharedBytes = kStages * sizeof(Stage);
static_assert(sizeof(Stage) % 16 == 0 && kLdX % 4 == 0 && kLdW % 4 == 0, "16-byte copies into the stages");
static_assert(kRows * kStageK / 4 == kThreads, "one x piece per thread and stage");

// Block (column group, head, token group). Requires k % kStageK == 0, n % kCols == 0 and 16-byte
// aligned rows (head_gemm_tf32_supported).
__global__ void __launch_bounds__(kThreads) head_gemm_tf32_kernel(const float* x, int64_t x_token_stride,
                                                                 int64_t x_head_stride, const float* w, int k, int n,
                                                                 float* y, int64_t y_token_stride,
                                                                 int64_t y_head_stride, int num_tokens,
                                                                 uint16_t* y_bf16, int64_t ld_y_bf16) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Stage* stages = reinterpret_cast<Stage*>(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int col0 = blockIdx.x * kCols, h = blockIdx.y, t0 = blockIdx.z * kRows;
  const int num_steps = k / kStageK;

  // A warp copies weight rows warp + 8 j of a stage, a lane one 16-byte piece of each.
  const float* w_src = w + static_cast<int64_t>(h) * k * n + col0 + 4 * lane;
  auto issue_w = [&](int s) {
    Stage& st = stages[s % kStages];
#pragma unroll
    for (int j = 0; j < kStageK / kWarps; ++j) {
      const int r = warp + kWarps * j;
      cp_async16(&st.w[r][4 * lane], w_src + static_cast<int64_t>(s * kStageK + r) * n, true);
    }
  };
  // A thread copies piece threadIdx.x % 8 of x row threadIdx.x / 8 (zeros past the last token).
  const int x_row = threadIdx.x / 8, x_piece = threadIdx.x % 8;
  const bool x_valid = t0 + x_row < num_tokens;
  const float* x_src =
      x + static_cast<int64_t>(x_valid ? t0 + x_row : 0) * x_token_stride + h * x_head_stride + 4 * x_piece;
  auto issue_x = [&](int s) {
    cp_async16(&stages[s % kStages].x[x_row][4 * x_piece], x_src + s * kStageK, x_valid);
  };

  // The weights, which no kernel writes, are requested before the wait for the kernels before
  // this one; the first commit group holds them with the first x stage.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < num_steps) issue_w(s);
  await_previous_kernels();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_steps) issue_x(s);
    cp_async_commit();
  }

  const int row0 = 16 * (warp / 4), wcol0 = 32 * (warp % 4);  // this warp's 16 tokens and 32 columns
  float acc[4][4] = {};
  for (int s = 0; s < num_steps; ++s) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage s is in place; every warp is done with stage s - 1, whose slot loads next
    const int next = s + kStages - 1;
    if (next < num_steps) {
      issue_w(next);
      issue_x(next);
    }
    cp_async_commit();
    const Stage& st = stages[s % kStages];
#pragma unroll
    for (int ks = 0; ks < kStageK / 8; ++ks) {
      const int c = 8 * ks + tq;
      const uint32_t a[4] = {to_tf32(st.x[row0 + g][c]), to_tf32(st.x[row0 + g + 8][c]),
                             to_tf32(st.x[row0 + g][c + 4]), to_tf32(st.x[row0 + g + 8][c + 4])};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = wcol0 + 8 * j + g;
        mma_tf32_16x8x8(acc[j], a, to_tf32(st.w[c][col]), to_tf32(st.w[c + 4][col]));
      }
    }
  }

  // acc[j]: rows g and g + 8, columns 2 tq and 2 tq + 1 of the warp's n-tile j.
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int col = col0 + wcol0 + 8 * j + 2 * tq;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int t = t0 + row0 + g + 8 * hi;
      if (t >= num_tokens) continue;
      const float v0 = acc[j][2 * hi], v1 = acc[j][2 * hi + 1];
      const int64_t offset = h * y_head_stride + col;
      *reinterpret_cast<float2*>(y + t * y_token_stride + offset) = make_float2(v0, v1);
      if (y_bf16 != nullptr)
        *reinterpret_cast<__nv_bfloat162*>(y_bf16 + t * ld_y_bf16 + offset) = __floats2bfloat162_rn(v0, v1);
    }
  }
}

}  // namespace

bool head_gemm_tf32_supported(const float* x, int64_t x_token_stride, int64_t x_head_stride, const float* w, int k,
                              int n, const float* y, int64_t y_token_stride, int64_t y_head_stride) {
  auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return k > 0 && k % kStageK == 0 && n % kCols == 0 && x_token_stride % 4 == 0 && x_head_stride % 4 == 0 &&
         y_token_stride % 2 == 0 && y_head_stride % 2 == 0 && aligned16(x) && aligned16(w) && aligned16(y);
}

bool launch_head_gemm_tf32(const float* x, int64_t x_token_stride, int64_t x_head_stride, const float* w,
                           int num_heads, int k, int n, float* y, int64_t y_token_stride, int64_t y_head_stride,
                           int num_tokens, uint16_t* y_bf16, int64_t ld_y_bf16, Stream stream) {
  DS_CHECK(head_gemm_tf32_supported(x, x_token_stride, x_head_stride, w, k, n, y, y_token_stride, y_head_stride));
  const int64_t token_groups = (num_tokens + kRows - 1) / kRows;
  DS_CHECK(token_groups <= 65535 && num_heads <= 65535);
  if (num_tokens == 0) return false;
  const bool bf16_fits = y_bf16 != nullptr && ld_y_bf16 % 2 == 0 && reinterpret_cast<uintptr_t>(y_bf16) % 4 == 0;
  allow_shared_bytes<head_gemm_tf32_kernel>(kSharedBytes);
  const dim3 grid(n / kCols, num_heads, static_cast<unsigned>(token_groups));
  launch_kernel(head_gemm_tf32_kernel, grid, kThreads, kSharedBytes, stream, x, x_token_stride, x_head_stride, w, k,
                n, y, y_token_stride, y_head_stride, num_tokens, bf16_fits ? y_bf16 : nullptr, ld_y_bf16);
  DS_CUDA_CHECK_LAUNCH();
  return bf16_fits;
}

}  // namespace dsinfer::cuda
