// Element-wise and per-row kernels of the CUDA backend. Activations are fp32; these kernels
// are memory-bound and kept simple: one thread per element, or one block per row where a row
// needs a reduction. The two that run over every prefill product's input or output (bf16
// conversion, SiLU·up) take eight elements per thread in 16-byte accesses.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/bf16_store.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/fp8_quantize.cuh"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/row_rms.cuh"
#include "backend/cuda/vector_load.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;

int num_blocks_for(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

// The block's sum of its threads' values (every thread gets it); warp_sums holds 32 floats.
__device__ float block_sum(float sum, float* warp_sums) {
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) warp_sums[0] = sum;
  }
  __syncthreads();
  return warp_sums[0];
}

// Rows of up to this many float4 per thread (kThreads * 4 * 8 = 8,192 floats: every hidden size
// of the DeepSeek family) are normalised from registers. Each thread issues all its loads, of
// the row, the added row and the weight, before it uses any, so a row costs one memory latency
// instead of one per loop step: at batch 1 a norm of 2,048 floats took 8.6 µs as a loop. The
// kernel is compiled for 2, 4 and 8 float4 a thread and takes the fewest that hold the row
// (rows of 1,025 to 2,048 floats: one float4 a thread, registers_kernel_for): sized for 8, a
// row of 2,048 held 106 registers a thread for the 2 it used, two blocks fitted on an SM, and a
// prefill's norms ran at three quarters of the copy rate.
constexpr int kNormVec4PerThread = 8;

bool norm_fits_registers(const void* x, const void* y, const void* w, const void* out, int64_t n) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return n % 4 == 0 && n <= int64_t{kThreads} * 4 * kNormVec4PerThread && aligned(x) && aligned(w) &&
         aligned(out) && (y == nullptr || aligned(y));
}

// Where a norm also writes its output in bf16: y [rows, ldy], columns n..ldy zero; and with q
// (the register form only, n a multiple of 128 and ldy == n), those bf16 values in DeepSeek's FP8
// activations as launch_quantize_rows_e4m3 makes them: q [rows_padded, n], q_scales [n / 128,
// rows_padded], the rows from `rows` on zeros (a block each).
struct NormBf16Copy {
  __nv_bfloat16* y = nullptr;
  int64_t ldy = 0;
  uint8_t* q = nullptr;
  float* q_scales = nullptr;
  int64_t rows = 0, rows_padded = 0;
};

// A padding row of the e4m3 rows: zero codes, scale 1 (what the quantising pass gives a row of
// zeros).
__device__ void zero_e4m3_row(const NormBf16Copy& copy, int n) {
  const int64_t row = blockIdx.x;
  for (int c = 4 * threadIdx.x; c < n; c += 4 * blockDim.x) *reinterpret_cast<uint32_t*>(copy.q + row * n + c) = 0;
  for (int t = threadIdx.x; t < n / 128; t += blockDim.x) copy.q_scales[t * copy.rows_padded + row] = 1.0f;
}

// What the register norm adds to x before it normalises: nothing, a row of y, or a MoE layer's
// output made from its rows (CombineAddend). add<kRowsInFlight>(row, i, v) adds the addend's
// columns 4i..4i+3 of the row to v, reading up to kRowsInFlight of the rows it adds at once.
struct NoAddend {
  static constexpr bool kAdds = false;
  static constexpr bool kReadsRowsAtFewRows = false;
  template <int kRowsInFlight>
  __device__ void add(int64_t, int, float4&) const {}
};

struct RowAddend {
  static constexpr bool kAdds = true;
  static constexpr bool kReadsRowsAtFewRows = false;
  const float* y;
  int64_t n;
  template <int kRowsInFlight>
  __device__ void add(int64_t row, int i, float4& v) const {
    const float4 a = reinterpret_cast<const float4*>(y + row * n)[i];
    v = make_float4(v.x + a.x, v.y + a.y, v.z + a.z, v.w + a.w);
  }
};

// The row launch_moe_combine would write (cuda_moe.cu's combine_kernel: the same operations in
// the same order, so the same bits), made where the norm reads it instead of written and read
// back: sum_k weights[k] * expert_out[slot_row[k]] in slot order, then + shared.
//
// kRowsInFlight 1 (the forms for many rows, some compiled for four blocks an SM): each slot's
// row is read once its slot number has come, and added once it has come, so a token's slots
// take about two round trips through L2 each, one after another. Otherwise (steps of few rows,
// registers_kernel_for) the slots are read kRowsInFlight at a time, their weights and rows
// all requested before the first is added, and added in the same order; past top_k the last
// slot is read again and not added.
template <typename T>
struct CombineAddend {
  static constexpr bool kAdds = true;
  static constexpr bool kReadsRowsAtFewRows = true;  // registers_kernel_for
  MoeCombineRows moe;
  int64_t n;
  template <int kRowsInFlight>
  __device__ void add(int64_t row, int i, float4& v) const {
    const T* expert_out = static_cast<const T*>(moe.expert_out);
    float acc[4] = {}, e[4];
    if constexpr (kRowsInFlight == 1) {
      float weight[kMoeCombineInNormMaxTopK];
      const T* slot[kMoeCombineInNormMaxTopK];
#pragma unroll
      for (int k = 0; k < kMoeCombineInNormMaxTopK; ++k) {
        if (k >= moe.top_k) break;
        weight[k] = moe.weights[row * moe.top_k + k];
        slot[k] = expert_out + static_cast<int64_t>(moe.slot_row[row * moe.top_k + k]) * moe.ld_expert;
      }
#pragma unroll
      for (int k = 0; k < kMoeCombineInNormMaxTopK; ++k) {
        if (k >= moe.top_k) break;
        load4(slot[k] + 4 * i, e);
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] += weight[k] * e[j];
      }
    } else {
      const int top_k = moe.top_k;
      for (int k0 = 0; k0 < top_k; k0 += kRowsInFlight) {
        float weight[kRowsInFlight], rows[kRowsInFlight][4];
#pragma unroll
        for (int d = 0; d < kRowsInFlight; ++d) {
          const int k = min(k0 + d, top_k - 1);
          weight[d] = moe.weights[row * top_k + k];
          load4(expert_out + static_cast<int64_t>(moe.slot_row[row * top_k + k]) * moe.ld_expert + 4 * i, rows[d]);
        }
        // The products added as the form above adds them (each a fused multiply-add).
#pragma unroll
        for (int d = 0; d < kRowsInFlight; ++d)
          if (k0 + d < top_k)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[j] = fmaf(weight[d], rows[d][j], acc[j]);
      }
    }
    if (moe.shared != nullptr) {
      load4(moe.shared + row * n + 4 * i, e);
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[j] += e[j];
    }
    v = make_float4(v.x + acc[0], v.y + acc[1], v.z + acc[2], v.w + acc[3]);
  }
};

// One block of kBlockThreads per row: x += the addend first where it adds one (x updated in
// memory), then out = the row's RMS norm, its mean square in fp32 through a block reduction. x
// and out may alias: every thread holds its elements in registers before it writes them.
template <typename Addend, int kVec4, int kBlockThreads, int kMinBlocksPerSm, int kRowsInFlight>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSm)
    rms_norm_registers_kernel(float* x, Addend addend, const float* w, float eps, int n, float* out,
                              NormBf16Copy copy) {
  constexpr bool kAddFirst = Addend::kAdds;
  await_previous_kernels();
  if (copy.q != nullptr && blockIdx.x >= copy.rows) {  // the whole block alike
    zero_e4m3_row(copy, n);
    return;
  }
  __shared__ float warp_sums[32];
  const int64_t base = blockIdx.x * static_cast<int64_t>(n);
  float4* row = reinterpret_cast<float4*>(x + base);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4* dst = reinterpret_cast<float4*>(out + base);
  const int n4 = n / 4;
  float4 v[kVec4], wv[kVec4];
#pragma unroll
  for (int j = 0; j < kVec4; ++j) {
    const int i = threadIdx.x + j * kBlockThreads;
    if (i < n4) {
      v[j] = row[i];
      wv[j] = __ldg(w4 + i);
      addend.template add<kRowsInFlight>(blockIdx.x, i, v[j]);
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec4; ++j) {
    const int i = threadIdx.x + j * kBlockThreads;
    if (i < n4) {
      if constexpr (kAddFirst) row[i] = v[j];
      // One FMA after another: written as a sum of products, the compiler may fuse either
      // product with its add, and chose differently in different forms of this kernel (the
      // fused add and the norm after an add then differed in a row's last bit).
      sum = fmaf(v[j].x, v[j].x, sum);
      sum = fmaf(v[j].y, v[j].y, sum);
      sum = fmaf(v[j].z, v[j].z, sum);
      sum = fmaf(v[j].w, v[j].w, sum);
    }
  }
  const float inv = rsqrtf(block_sum(sum, warp_sums) / static_cast<float>(n) + eps);
  __nv_bfloat16* copy_row = copy.y == nullptr ? nullptr : copy.y + blockIdx.x * copy.ldy;
#pragma unroll
  for (int j = 0; j < kVec4; ++j) {
    const int i = threadIdx.x + j * kBlockThreads;
    if (i < n4) {
      const float4 o = make_float4(v[j].x * inv * wv[j].x, v[j].y * inv * wv[j].y, v[j].z * inv * wv[j].z,
                                   v[j].w * inv * wv[j].w);
      dst[i] = o;
      if (copy_row != nullptr) store_bf16x4(copy_row + 4 * i, o);
      if (copy.q != nullptr) {  // this warp's lanes hold one 128-column tile, four columns each
        const float q_in[4] = {round_to_bf16(o.x), round_to_bf16(o.y), round_to_bf16(o.z), round_to_bf16(o.w)};
        const float scale = quantize_tile_e4m3(q_in, copy.q + blockIdx.x * static_cast<int64_t>(n) + 4 * i);
        if (threadIdx.x % 32 == 0) copy.q_scales[(4 * i / 128) * copy.rows_padded + blockIdx.x] = scale;
      }
    }
  }
  if (copy_row != nullptr)
    for (int64_t c = n + 4 * threadIdx.x; c < copy.ldy; c += 4 * kBlockThreads) store_bf16x4(copy_row + c, float4{});
}

// The same norms for any row width, in loops over the row (widths not a multiple of 4 or wider
// than the register form holds). Each thread re-reads only the elements it wrote, and x and out
// may alias: every thread reads its own elements before writing them.
template <bool kAddFirst>
__global__ void rms_norm_loop_kernel(float* x, const float* y, const float* w, float eps, int64_t n, float* out,
                                     NormBf16Copy copy) {
  await_previous_kernels();
  __shared__ float warp_sums[32];
  float* row = x + blockIdx.x * n;
  float* dst = out + blockIdx.x * n;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v = row[i];
    if constexpr (kAddFirst) {
      v += y[blockIdx.x * n + i];
      row[i] = v;
    }
    sum += v * v;
  }
  const float inv = rsqrtf(block_sum(sum, warp_sums) / static_cast<float>(n) + eps);
  __nv_bfloat16* copy_row = copy.y == nullptr ? nullptr : copy.y + blockIdx.x * copy.ldy;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float o = row[i] * inv * w[i];
    dst[i] = o;
    if (copy_row != nullptr) copy_row[i] = __float2bfloat16_rn(o);
  }
  if (copy_row != nullptr)
    for (int64_t c = n + threadIdx.x; c < copy.ldy; c += blockDim.x) copy_row[c] = __float2bfloat16_rn(0.0f);
}

// A block of kRmsThreads a row: the row's 1 / rms as the products apply it (row_rms.cuh).
constexpr int kRmsThreads = 128;
__global__ void __launch_bounds__(kRmsThreads)
    apply_row_rms_kernel(RowRmsScale s, float* out, __nv_bfloat16* out_bf16) {
  await_previous_kernels();
  __shared__ float warp_sums[kRmsThreads / 32];
  __shared__ float4 stage[kRmsThreads];
  const int64_t row = blockIdx.x;
  stage_rms_share<kRmsThreads>(s, row, stage);
  cp_async_commit();
  cp_async_wait<0>();
  const float v = warp_sum(rms_share_sum<kRmsThreads>(s, stage, [row] { return row; }));
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  const float scale = rms_scale_of<kRmsThreads / 32>(warp_sums, 1, s);
  for (int64_t i = row * s.n + threadIdx.x; i < (row + 1) * s.n; i += kRmsThreads) {
    const float o = out[i] * scale;
    out[i] = o;
    out_bf16[i] = __float2bfloat16_rn(o);
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  await_previous_kernels();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] += y[i];
}

__global__ void silu_mul_kernel(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  await_previous_kernels();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * inter) return;
  const int64_t r = i / inter, c = i % inter;
  const float g = gate_up[r * 2 * inter + c];
  const float u = gate_up[r * 2 * inter + inter + c];
  out[i] = g / (1.0f + expf(-g)) * u;
}

__global__ void concat_cols_kernel(const float* a, const float* b, int64_t rows, int64_t na, int64_t nb, float* out) {
  await_previous_kernels();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t width = na + nb;
  if (i >= rows * width) return;
  const int64_t r = i / width, c = i % width;
  out[i] = c < na ? a[r * na + c] : b[r * nb + c - na];
}

__global__ void resolve_placeholders_kernel(int32_t* ids, int64_t n, const int32_t* chosen) {
  await_previous_kernels();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n && ids[i] < 0) ids[i] = chosen[-1 - ids[i]];
}

// out[i] = x[rows[i]] for rows of `width` elements (floats, or 16-byte vectors of bf16).
template <typename T>
__global__ void gather_rows_kernel(const T* x, const int32_t* rows, int64_t num_rows, int64_t width, T* out) {
  await_previous_kernels();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= num_rows * width) return;
  const int64_t r = i / width, c = i % width;
  out[i] = x[static_cast<int64_t>(rows[r]) * width + c];
}

__global__ void scatter_rows_kernel(const float* x, const int32_t* rows, int64_t num_rows, int64_t width,
                                    float* out) {
  await_previous_kernels();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= num_rows * width) return;
  const int64_t r = i / width, c = i % width;
  out[static_cast<int64_t>(rows[r]) * width + c] = x[i];
}

// Eight fp32 values as eight bf16 in one 16-byte word.
__device__ uint4 pack_bf16x8(const float (&v)[8]) {
  uint4 packed;
  uint32_t* words = reinterpret_cast<uint32_t*>(&packed);
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    words[i] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  return packed;
}

// Eight output columns per thread, one 16-byte store (ldy a multiple of 8). `vector_loads`:
// x is 16-byte aligned and k a multiple of 4, so whole groups read as two float4.
__global__ void f32_to_bf16_padded_kernel(const float* x, int64_t rows, int64_t k, int64_t ldy, bool vector_loads,
                                          __nv_bfloat16* y) {
  await_previous_kernels();
  const int64_t groups = ldy / 8;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * groups) return;
  const int64_t r = i / groups, c0 = (i % groups) * 8;
  const float* src = x + r * k + c0;
  float v[8];
  if (vector_loads && c0 + 8 <= k) {
    load8(src, v);
  } else {
    for (int j = 0; j < 8; ++j) v[j] = c0 + j < k ? src[j] : 0.0f;
  }
  *reinterpret_cast<uint4*>(y + r * ldy + c0) = pack_bf16x8(v);
}

// y [rows, 2 · half] = [x | x]: each element of x [rows, cols] (T: its bits) at its column and
// half columns further, zeros after each copy's cols.
template <typename T>
__global__ void rows_twice_kernel(const T* x, int64_t rows, int64_t cols, int64_t half, T* y) {
  await_previous_kernels();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * half) return;
  const int64_t r = i / half, c = i % half;
  const T v = c < cols ? x[r * cols + c] : T{0};
  y[r * 2 * half + c] = v;
  y[r * 2 * half + half + c] = v;
}

// Where output column j's gate is in a gate/up row, and how far its up is: interleaved, outputs
// j..j+7 of a group of 16 have their gates at weight rows 32 (j / 16) + j % 16 onward and their
// ups 16 rows further; in halves, the ups are inter_padded rows further. Each side of 8 outputs
// is one contiguous run.
__device__ __forceinline__ int64_t gate_column(int64_t j, bool halves) { return halves ? j : (j / 16) * 32 + j % 16; }
__device__ __forceinline__ int64_t up_offset(int64_t inter_padded, bool halves) { return halves ? inter_padded : 16; }

// Eight outputs per thread (inter_padded a multiple of 16).
template <typename T>
__global__ void silu_mul_interleaved_kernel(const T* gate_up, int64_t rows, int64_t inter_padded, bool halves,
                                            __nv_bfloat16* out) {
  await_previous_kernels();
  const int64_t groups = inter_padded / 8;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * groups) return;
  const int64_t r = i / groups, j0 = (i % groups) * 8;
  const T* gate = gate_up + r * 2 * inter_padded + gate_column(j0, halves);
  float g[8], u[8], act[8];
  load8(gate, g);
  load8(gate + up_offset(inter_padded, halves), u);
  for (int j = 0; j < 8; ++j) act[j] = silu_times(g[j], u[j]);
  *reinterpret_cast<uint4*>(out + r * inter_padded + j0) = pack_bf16x8(act);
}

// SiLU·up straight into the down product's FP8 rows: the same bits as silu_mul_interleaved's
// bf16 rows quantised by launch_quantize_rows_e4m3, without writing and reading those rows back
// (a quarter of the pass's bytes at 2,816 columns), in the quantising pass's blocks
// (fp8_quantize.cuh).
template <typename T>
__global__ void __launch_bounds__(kQuantizeThreads)
    silu_mul_interleaved_e4m3_kernel(const T* gate_up, int64_t rows, int64_t inter_padded, bool halves,
                                     int64_t rows_padded, uint8_t* q, float* scales) {
  await_previous_kernels();
  const QuantizePlace at = quantize_place(inter_padded);
  const int64_t gate_col = gate_column(at.col, halves), up_col = gate_col + up_offset(inter_padded, halves);
  float g[kQuantizeRowsPerThread][8], u[kQuantizeRowsPerThread][8];
#pragma unroll
  for (int i = 0; i < kQuantizeRowsPerThread; ++i) {
    const int64_t row = at.row0 + i * kQuantizeRowsAtOnce;
    if (row < rows) {
      load8(gate_up + row * 2 * inter_padded + gate_col, g[i]);
      load8(gate_up + row * 2 * inter_padded + up_col, u[i]);
    } else {  // padding rows quantise to zeros, as the quantising pass makes them
#pragma unroll
      for (int j = 0; j < 8; ++j) g[i][j] = u[i][j] = 0.0f;
    }
  }
#pragma unroll
  for (int i = 0; i < kQuantizeRowsPerThread; ++i) {
    float act[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)  // rounded to bf16, as the rows the two-pass form writes
      act[j] = round_to_bf16(silu_times(g[i][j], u[i][j]));
    store_e4m3_row(at, i, act, inter_padded, rows_padded, q, scales);
  }
}

}  // namespace

void launch_f32_to_bf16_padded(const float* x, int64_t rows, int64_t k, int64_t ldy, uint16_t* y, Stream stream) {
  DS_CHECK_MSG(ldy % 8 == 0 && ldy >= k && reinterpret_cast<uintptr_t>(y) % 16 == 0,
               "f32_to_bf16_padded: the bf16 rows (" << ldy << " wide) must be 16-byte aligned");
  const int64_t n = rows * (ldy / 8);
  if (n == 0) return;
  const bool vector_loads = k % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  launch_kernel(f32_to_bf16_padded_kernel, num_blocks_for(n), kThreads, 0, stream, x, rows, k, ldy, vector_loads,
                reinterpret_cast<__nv_bfloat16*>(y));
  DS_CUDA_CHECK_LAUNCH();
}

void launch_rows_twice(const void* x, size_t element_bytes, int64_t rows, int64_t cols, int64_t half, void* y,
                       Stream stream) {
  DS_CHECK_MSG((element_bytes == 2 || element_bytes == 4) && cols <= half,
               "rows_twice: " << element_bytes << "-byte elements, " << cols << " columns in halves of " << half);
  const int64_t n = rows * half;
  if (n == 0) return;
  if (element_bytes == 2)
    launch_kernel(rows_twice_kernel<uint16_t>, num_blocks_for(n), kThreads, 0, stream, static_cast<const uint16_t*>(x),
                  rows, cols, half, static_cast<uint16_t*>(y));
  else
    launch_kernel(rows_twice_kernel<uint32_t>, num_blocks_for(n), kThreads, 0, stream, static_cast<const uint32_t*>(x),
                  rows, cols, half, static_cast<uint32_t*>(y));
  DS_CUDA_CHECK_LAUNCH();
}

void launch_silu_mul_interleaved(const void* gate_up, bool gate_up_bf16, int64_t rows, int64_t inter_padded,
                                 bool halves, uint16_t* out, Stream stream) {
  const uintptr_t in_alignment = gate_up_bf16 ? 16 : 32;
  DS_CHECK_MSG(inter_padded % 16 == 0 && reinterpret_cast<uintptr_t>(gate_up) % in_alignment == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0,
               "silu_mul_interleaved: " << inter_padded << " outputs per row, or an unaligned buffer");
  const int64_t n = rows * (inter_padded / 8);
  if (n == 0) return;
  auto* y = reinterpret_cast<__nv_bfloat16*>(out);
  if (gate_up_bf16)
    launch_kernel(silu_mul_interleaved_kernel<__nv_bfloat16>, num_blocks_for(n), kThreads, 0, stream,
                  static_cast<const __nv_bfloat16*>(gate_up), rows, inter_padded, halves, y);
  else
    launch_kernel(silu_mul_interleaved_kernel<float>, num_blocks_for(n), kThreads, 0, stream,
                  static_cast<const float*>(gate_up), rows, inter_padded, halves, y);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_silu_mul_interleaved_e4m3(const void* gate_up, bool gate_up_bf16, int64_t rows, int64_t inter_padded,
                                      bool halves, int64_t rows_padded, uint8_t* q, float* scales, Stream stream) {
  const uintptr_t in_alignment = gate_up_bf16 ? 16 : 32;
  DS_CHECK_MSG(inter_padded % 128 == 0 && rows_padded >= rows &&
                   reinterpret_cast<uintptr_t>(gate_up) % in_alignment == 0 &&
                   reinterpret_cast<uintptr_t>(q) % 8 == 0,
               "silu_mul_interleaved_e4m3: " << inter_padded << " outputs per row, or an unaligned buffer");
  const int64_t num_blocks = quantize_num_blocks(rows_padded, inter_padded);
  if (num_blocks == 0) return;
  if (gate_up_bf16)
    launch_kernel(silu_mul_interleaved_e4m3_kernel<__nv_bfloat16>, static_cast<unsigned>(num_blocks), kQuantizeThreads,
                  0, stream, static_cast<const __nv_bfloat16*>(gate_up), rows, inter_padded, halves, rows_padded, q,
                  scales);
  else
    launch_kernel(silu_mul_interleaved_e4m3_kernel<float>, static_cast<unsigned>(num_blocks), kQuantizeThreads, 0,
                  stream, static_cast<const float*>(gate_up), rows, inter_padded, halves, rows_padded, q, scales);
  DS_CUDA_CHECK_LAUNCH();
}

namespace {
// The register form's kernel for rows of n with this addend, and its block size. Rows of
// 1,025 to 2,048 floats (DeepSeek-V2-Lite's 2,048) take blocks of 512 threads of one float4
// each, bounded to 32 registers so that four fit on an SM (the compiler keeps fewer loads in
// flight rather than spilling): the combine made by the norm (CombineAddend) held 63 registers
// a thread with two float4 each, four blocks of 256 fitted on an SM, and it read its scattered
// rows at 2.9 TB/s where the plain norm read 3.8; it now reads them at 3.7 (3.3 at three blocks
// of 40 registers). Wider rows take blocks of 256 threads and the fewest float4 a thread that
// hold the row. Every addend takes the same form for the same n, so that each gives the bits of
// the others (launch_moe_combine then the add, or the fused combine).
//
// Steps of no more rows than the GPU has SMs (decode) put one block on an SM at most; there a
// combine made by the norm takes the same form compiled without the bound on registers and
// reading all of a token's routed rows at once (CombineAddend's kRowsInFlight), the same
// arithmetic in the same order, so the same bits.
template <typename Addend, int kRowsInFlight>
auto narrow_registers_kernel(int64_t vec4_per_thread) {
  return vec4_per_thread <= 2   ? rms_norm_registers_kernel<Addend, 2, kThreads, 1, kRowsInFlight>
         : vec4_per_thread <= 4 ? rms_norm_registers_kernel<Addend, 4, kThreads, 1, kRowsInFlight>
                                : rms_norm_registers_kernel<Addend, kNormVec4PerThread, kThreads, 1, kRowsInFlight>;
}

template <typename Addend>
auto registers_kernel_for(int64_t n, int64_t rows) {
  using Kernel = void (*)(float*, Addend, const float*, float, int, float*, NormBf16Copy);
  struct Form {
    Kernel kernel;
    unsigned threads;
  };
  constexpr int kWideThreads = 2 * kThreads;
  constexpr int kFewRowsInFlight = Addend::kReadsRowsAtFewRows ? kMoeCombineInNormMaxTopK : 0;
  const bool few = kFewRowsInFlight > 0 && rows <= device_multiprocessors();
  const bool wide = n > 4 * kThreads && n <= 4 * kWideThreads;
  if constexpr (kFewRowsInFlight > 0) {
    if (few && wide) return Form{rms_norm_registers_kernel<Addend, 1, kWideThreads, 1, kFewRowsInFlight>, kWideThreads};
  }
  if (wide) return Form{rms_norm_registers_kernel<Addend, 1, kWideThreads, 4, 1>, kWideThreads};
  const int64_t vec4_per_thread = (n / 4 + kThreads - 1) / kThreads;
  if constexpr (kFewRowsInFlight > 0) {
    if (few) return Form{narrow_registers_kernel<Addend, kFewRowsInFlight>(vec4_per_thread), kThreads};
  }
  return Form{narrow_registers_kernel<Addend, 1>(vec4_per_thread), static_cast<unsigned>(kThreads)};
}

NormBf16Copy bf16_copy_of(int64_t rows, int64_t n, uint16_t* out_bf16, int64_t ld_bf16, const E4m3Rows& e4m3) {
  NormBf16Copy copy;
  if (out_bf16 != nullptr) {
    DS_CHECK_MSG(ld_bf16 % 8 == 0 && ld_bf16 >= n && reinterpret_cast<uintptr_t>(out_bf16) % 16 == 0,
                 "rms_norm: the bf16 rows (" << ld_bf16 << " wide) must be 16-byte aligned");
    copy = NormBf16Copy{reinterpret_cast<__nv_bfloat16*>(out_bf16), ld_bf16};
  }
  if (e4m3.q != nullptr)
    DS_CHECK_MSG(out_bf16 != nullptr && ld_bf16 == n && n % 128 == 0 && e4m3.rows_padded >= rows,
                 "rms_norm: e4m3 rows need the bf16 ones, " << n << " columns in whole 128-column tiles");
  return copy;
}

// The register form with this addend (the row must fit: norm_fits_registers), the e4m3 rows
// written by the norm itself where asked for.
template <typename Addend>
void launch_norm_registers(float* x, const Addend& addend, const float* w, float eps, int64_t rows, int64_t n,
                           float* out, NormBf16Copy copy, const E4m3Rows& e4m3, Stream stream) {
  unsigned num_blocks = static_cast<unsigned>(rows);
  if (e4m3.q != nullptr) {
    copy.q = e4m3.q;
    copy.q_scales = e4m3.scales;
    copy.rows = rows;
    copy.rows_padded = e4m3.rows_padded;
    num_blocks = static_cast<unsigned>(e4m3.rows_padded);
  }
  const auto form = registers_kernel_for<Addend>(n, num_blocks);
  launch_kernel(form.kernel, num_blocks, form.threads, 0, stream, x, addend, w, eps, static_cast<int>(n), out, copy);
  DS_CUDA_CHECK_LAUNCH();
}

// Either norm, from registers where the row fits them, else in loops (then the e4m3 rows, if
// asked for, by the quantising pass over the bf16 ones).
template <bool kAddFirst>
void launch_norm(float* x, const float* y, const float* w, float eps, int64_t rows, int64_t n, float* out,
                 uint16_t* out_bf16, int64_t ld_bf16, const E4m3Rows& e4m3, Stream stream) {
  if (rows == 0) return;
  const NormBf16Copy copy = bf16_copy_of(rows, n, out_bf16, ld_bf16, e4m3);
  if (norm_fits_registers(x, y, w, out, n)) {
    if constexpr (kAddFirst) launch_norm_registers(x, RowAddend{y, n}, w, eps, rows, n, out, copy, e4m3, stream);
    else launch_norm_registers(x, NoAddend{}, w, eps, rows, n, out, copy, e4m3, stream);
    return;
  }
  launch_kernel(rms_norm_loop_kernel<kAddFirst>, static_cast<unsigned>(rows), kThreads, 0, stream, x, y, w, eps, n,
                out, copy);
  DS_CUDA_CHECK_LAUNCH();
  if (e4m3.q != nullptr)
    launch_quantize_rows_e4m3(out_bf16, rows, n, e4m3.rows_padded, e4m3.q, e4m3.scales, stream);
}
}  // namespace

void launch_rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* out,
                     uint16_t* out_bf16, int64_t ld_bf16, const E4m3Rows& e4m3, Stream stream) {
  // Without the add the kernels only read x.
  launch_norm<false>(const_cast<float*>(x), nullptr, w, eps, rows, n, out, out_bf16, ld_bf16, e4m3, stream);
}

void launch_add_rms_norm(float* x, const float* y, const float* w, float eps, int64_t rows, int64_t n, float* out,
                         uint16_t* out_bf16, int64_t ld_bf16, const E4m3Rows& e4m3, Stream stream) {
  launch_norm<true>(x, y, w, eps, rows, n, out, out_bf16, ld_bf16, e4m3, stream);
}

void launch_moe_combine_add_rms_norm(float* x, const MoeCombineRows& moe, float* combined, const float* w, float eps,
                                     int64_t rows, int64_t n, float* out, uint16_t* out_bf16, int64_t ld_bf16,
                                     const E4m3Rows& e4m3, Stream stream) {
  if (rows == 0) return;
  const bool fused = moe.top_k <= kMoeCombineInNormMaxTopK && moe_combine_rows_in_fours(moe, n) &&
                     norm_fits_registers(x, nullptr, w, out, n);
  if (!fused) {
    launch_moe_combine(moe, rows, n, combined, stream);
    launch_add_rms_norm(x, combined, w, eps, rows, n, out, out_bf16, ld_bf16, e4m3, stream);
    return;
  }
  const NormBf16Copy copy = bf16_copy_of(rows, n, out_bf16, ld_bf16, e4m3);
  if (moe.expert_out_bf16)
    launch_norm_registers(x, CombineAddend<__nv_bfloat16>{moe, n}, w, eps, rows, n, out, copy, e4m3, stream);
  else
    launch_norm_registers(x, CombineAddend<float>{moe, n}, w, eps, rows, n, out, copy, e4m3, stream);
}

void launch_apply_row_rms(const RowRmsScale& s, int64_t rows, float* out, uint16_t* out_bf16, Stream stream) {
  DS_CHECK(s.partials != nullptr && s.n % 16 == 0 && reinterpret_cast<uintptr_t>(s.partials) % 16 == 0);
  if (rows == 0) return;
  launch_kernel(apply_row_rms_kernel, static_cast<unsigned>(rows), kRmsThreads, 0, stream, s, out,
                reinterpret_cast<__nv_bfloat16*>(out_bf16));
  DS_CUDA_CHECK_LAUNCH();
}

void launch_add(float* x, const float* y, int64_t n, Stream stream) {
  if (n == 0) return;
  launch_kernel(add_kernel, num_blocks_for(n), kThreads, 0, stream, x, y, n);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_silu_mul(const float* gate_up, int64_t rows, int64_t inter, float* out, Stream stream) {
  if (rows * inter == 0) return;
  launch_kernel(silu_mul_kernel, num_blocks_for(rows * inter), kThreads, 0, stream, gate_up, rows, inter, out);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_concat_cols(const float* a, const float* b, int64_t rows, int64_t na, int64_t nb, float* out,
                        Stream stream) {
  if (rows * (na + nb) == 0) return;
  launch_kernel(concat_cols_kernel, num_blocks_for(rows * (na + nb)), kThreads, 0, stream, a, b, rows, na, nb, out);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_gather_rows(const float* x, const int32_t* rows, int64_t num_rows, int64_t width, float* out,
                        Stream stream) {
  if (num_rows * width == 0) return;
  launch_kernel(gather_rows_kernel<float>, num_blocks_for(num_rows * width), kThreads, 0, stream, x, rows, num_rows,
                width, out);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_gather_rows_bf16(const uint16_t* x, const int32_t* rows, int64_t num_rows, int64_t width, uint16_t* out,
                             Stream stream) {
  DS_CHECK_MSG(width % 8 == 0, "gather_rows_bf16: width " << width << " is not a multiple of 8");
  const int64_t vectors = width / 8;
  if (num_rows * vectors == 0) return;
  launch_kernel(gather_rows_kernel<uint4>, num_blocks_for(num_rows * vectors), kThreads, 0, stream,
                reinterpret_cast<const uint4*>(x), rows, num_rows, vectors, reinterpret_cast<uint4*>(out));
  DS_CUDA_CHECK_LAUNCH();
}

void launch_resolve_placeholders(int32_t* ids, int64_t n, const int32_t* chosen, Stream stream) {
  if (n == 0) return;
  launch_kernel(resolve_placeholders_kernel, num_blocks_for(n), kThreads, 0, stream, ids, n, chosen);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_scatter_rows(const float* x, const int32_t* rows, int64_t num_rows, int64_t width, float* out,
                         Stream stream) {
  if (num_rows * width == 0) return;
  launch_kernel(scatter_rows_kernel, num_blocks_for(num_rows * width), kThreads, 0, stream, x, rows, num_rows, width,
                out);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
