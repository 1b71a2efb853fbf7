// fp32 products on CUDA cores (gemm_f32.h): a thread block owns a tile of 64 rows of x by 64
// weight rows, brought through shared memory 16 columns of k at a time; each thread keeps a
// 4 x 4 grid of sums (rows ty + 16i, outputs tx + 16j, so that a warp's shared-memory reads
// fall in distinct banks or broadcast) and adds one product per k in order, chunk by chunk.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_f32.h"
#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/kernel_launch.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kTileRows = kGemmF32RowsPerBlock;
constexpr int kTileOutputs = 64;
constexpr int kTileK = 16;
constexpr int kThreads = 256;
constexpr int kSide = 16;                      // threads along each side of the tile
constexpr int kPerThread = kTileRows / kSide;  // 4 rows x 4 outputs a thread
constexpr int kLoadsPerThread = kTileRows * kTileK / kThreads;
static_assert(kTileRows == kTileOutputs && kSide * kSide == kThreads && kTileK == kSide);
static_assert(kGemmF32ChunkK % kTileK == 0);

__host__ __device__ inline int num_chunks(int k) { return (k + kGemmF32ChunkK - 1) / kGemmF32ChunkK; }

// Chunks in blocks of their own where the tiles alone would leave most of the GPU idle.
bool chunks_in_blocks(const GemmF32Args& a, int64_t max_row_blocks) {
  const int64_t output_tiles = (a.n + kTileOutputs - 1) / kTileOutputs;
  return num_chunks(a.k) > 1 && output_tiles * max_row_blocks < 2 * int64_t{device_multiprocessors()};
}

// kSplit: this block sums chunk blockIdx.z alone into a.partials [chunks, rows, n]; else every
// chunk in turn into y.
template <bool kSplit>
__global__ void __launch_bounds__(kThreads) gemm_f32_kernel(GemmF32Args a, int64_t block_base) {
  __shared__ float xs[kTileK][kTileRows + 1];     // transposed: xs[kk][row]
  __shared__ float ws[kTileK][kTileOutputs + 1];  // ws[kk][output]
  await_previous_kernels();
  const int64_t block = block_base + blockIdx.y;
  const float* weight = a.weight;
  int64_t row_begin = block * kTileRows, row_end = min(a.rows, row_begin + kTileRows);
  if (weight == nullptr) {
    if (block >= a.block_offsets[a.num_groups]) return;
    const int group = owner_of(a.block_offsets, a.num_groups, static_cast<int>(block));
    weight = a.groups[group];
    row_begin = a.row_offsets[group] + (block - a.block_offsets[group]) * kTileRows;
    row_end = min(int64_t{a.row_offsets[group + 1]}, row_begin + kTileRows);
  }
  if (row_begin >= row_end) return;
  const int n0 = blockIdx.x * kTileOutputs;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;

  // The tile elements this thread loads: row (or output) ty + kSide * q, column tx of the slab.
  const float* x_rows[kLoadsPerThread];
  const float* w_rows[kLoadsPerThread];
  for (int q = 0; q < kLoadsPerThread; ++q) {
    const int64_t row = row_begin + ty + kSide * q;
    x_rows[q] = row < row_end ? a.x + (a.src_rows != nullptr ? a.src_rows[row] : row) * a.ldx : nullptr;
    const int output = n0 + ty + kSide * q;
    w_rows[q] = output < a.n ? weight + int64_t{output} * a.k : nullptr;
  }
  const int chunk_end = kSplit ? blockIdx.z + 1 : num_chunks(a.k);
  float total[kPerThread][kPerThread] = {};
  float sums[kPerThread][kPerThread];
  for (int chunk = kSplit ? blockIdx.z : 0; chunk < chunk_end; ++chunk) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) sums[i][j] = 0.0f;
    const int k_end = min(a.k, (chunk + 1) * kGemmF32ChunkK);
    for (int k0 = chunk * kGemmF32ChunkK; k0 < k_end; k0 += kTileK) {
      const int k = k0 + tx;
      for (int q = 0; q < kLoadsPerThread; ++q) {
        xs[tx][ty + kSide * q] = x_rows[q] != nullptr && k < k_end ? x_rows[q][k] : 0.0f;
        ws[tx][ty + kSide * q] = w_rows[q] != nullptr && k < k_end ? w_rows[q][k] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kTileK; ++kk) {
        float xv[kPerThread], wv[kPerThread];
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) {
          xv[i] = xs[kk][ty + kSide * i];
          wv[i] = ws[kk][tx + kSide * i];
        }
#pragma unroll
        for (int i = 0; i < kPerThread; ++i)
#pragma unroll
          for (int j = 0; j < kPerThread; ++j) sums[i][j] = fmaf(xv[i], wv[j], sums[i][j]);
      }
      __syncthreads();
    }
    // The first chunk's sums as they are: total = ((c0 + c1) + c2) …, the split form's order.
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) total[i][j] = chunk == 0 ? sums[i][j] : total[i][j] + sums[i][j];
  }
  float* out = kSplit ? a.partials + blockIdx.z * a.rows * a.n : a.y;
  const int64_t ld = kSplit ? a.n : a.ldy;
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t row = row_begin + ty + kSide * i;
    if (row >= row_end) break;
    for (int j = 0; j < kPerThread; ++j) {
      const int output = n0 + tx + kSide * j;
      if (output < a.n) out[row * ld + output] = kSplit ? sums[i][j] : total[i][j];
    }
  }
}

// y[row, c] = ((p[0] + p[1]) + p[2]) … over the chunks' partial sums p [chunks, rows, n].
__global__ void gemm_f32_add_chunks_kernel(const float* partials, int chunks, int64_t rows, int n, float* y,
                                           int64_t ldy) {
  await_previous_kernels();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t count = rows * n;
  if (i >= count) return;
  float total = partials[i];
  for (int c = 1; c < chunks; ++c) total += partials[c * count + i];
  y[i / n * ldy + i % n] = total;
}

}  // namespace

int64_t gemm_f32_workspace_floats(const GemmF32Args& args, int64_t max_row_blocks) {
  return chunks_in_blocks(args, max_row_blocks) ? int64_t{num_chunks(args.k)} * args.rows * args.n : 0;
}

void launch_gemm_f32(const GemmF32Args& args, int64_t max_row_blocks, Stream stream) {
  DS_CHECK((args.weight != nullptr) != (args.groups != nullptr));
  DS_CHECK(args.n > 0 && args.k > 0 && args.ldx >= args.k && args.ldy >= args.n && args.rows >= 0);
  DS_CHECK(args.weight != nullptr ||
           (args.row_offsets != nullptr && args.block_offsets != nullptr && args.num_groups > 0));
  if (max_row_blocks <= 0 || args.rows == 0) return;
  const bool split = chunks_in_blocks(args, max_row_blocks);
  DS_CHECK_MSG(!split || args.partials != nullptr, "fp32 product: its chunks' partial sums need a workspace");
  constexpr int64_t kMaxGridY = 65535;
  const unsigned output_tiles = static_cast<unsigned>((args.n + kTileOutputs - 1) / kTileOutputs);
  const unsigned chunks = split ? static_cast<unsigned>(num_chunks(args.k)) : 1;
  for (int64_t base = 0; base < max_row_blocks; base += kMaxGridY) {
    const dim3 grid(output_tiles, static_cast<unsigned>(std::min(kMaxGridY, max_row_blocks - base)), chunks);
    if (split) launch_kernel(gemm_f32_kernel<true>, grid, kThreads, 0, stream, args, base);
    else launch_kernel(gemm_f32_kernel<false>, grid, kThreads, 0, stream, args, base);
    DS_CUDA_CHECK_LAUNCH();
  }
  if (!split) return;
  const int64_t count = args.rows * args.n;
  constexpr int kAddThreads = 256;
  launch_kernel(gemm_f32_add_chunks_kernel, dim3(static_cast<unsigned>((count + kAddThreads - 1) / kAddThreads)),
                kAddThreads, 0, stream, static_cast<const float*>(args.partials), static_cast<int>(chunks), args.rows,
                args.n, args.y, args.ldy);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
