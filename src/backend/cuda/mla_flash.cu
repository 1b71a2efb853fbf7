// Fused causal attention of the expanded MLA prefill form, flash-attention style on the
// mma.sync tensor-core instructions. A block owns 64 queries of one head, 16 per warp, and
// walks the keys they see 64 at a time; the next step's keys and values load (cp.async) while
// this step computes. Scores, probabilities and the output stay in registers: the fragments of
// a warp's scores are, once exponentiated and packed to bf16, the A operand of P·V.
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/mla_flash.h"
#include "backend/cuda/tensor_core.cuh"

namespace dsinfer::cuda {
namespace {

// The kernel's steps over a warp's 16 query rows × 64 keys of scores in mma.sync's accumulator
// layout: score(n, e) is key group n's value e (rows g, g + 8 for e >= 2, keys 8 n + 2 t + e % 2),
// out(n, e) the same for output column group n of kOutGroups.

// Scores to log2 units; keys past a row's position or at key_end and after set to -inf (only
// the steps on the diagonal or at the end have any).
template <int kKeys, typename Score>
__device__ __forceinline__ void scale_and_mask_scores(Score&& score, float scale_log2, int j0, int warp_pos,
                                                      int key_end, int g, int t) {
  const bool masked = j0 + kKeys - 1 > warp_pos || j0 + kKeys > key_end;
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = score(n, e) * scale_log2;
      if (masked) {
        const int key = j0 + n * 8 + 2 * t + (e & 1), pos = warp_pos + g + (e >> 1) * 8;
        if (key > pos || key >= key_end) v = -INFINITY;
      }
      score(n, e) = v;
    }
  }
}

// The online softmax over one step's scores: each row's running max and sum move on, the output
// so far is rescaled, and the scores become their exponentials. Every row sees key 0 at the
// first step, so its max is finite from then on.
template <int kKeys, int kOutGroups, typename Score, typename Out>
__device__ __forceinline__ void online_softmax_step(Score&& score, Out&& out, float (&row_max)[2],
                                                    float (&row_sum)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float m = row_max[i];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) m = fmaxf(m, fmaxf(score(n, 2 * i), score(n, 2 * i + 1)));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float rescale = exp2f(row_max[i] - m);  // 0 at the first step
    row_max[i] = m;
    row_sum[i] *= rescale;
#pragma unroll
    for (int n = 0; n < kOutGroups; ++n) {
      out(n, 2 * i) *= rescale;
      out(n, 2 * i + 1) *= rescale;
    }
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      score(n, 2 * i) = exp2f(score(n, 2 * i) - m);
      score(n, 2 * i + 1) = exp2f(score(n, 2 * i + 1) - m);
      row_sum[i] += score(n, 2 * i) + score(n, 2 * i + 1);
    }
  }
}

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kQueries = 16 * kWarps;  // a block's queries
constexpr int kKeys = 64;              // keys per step

// Shared memory of a block for (padded) head widths QK and V, in bf16 elements: Q [64][QK + 8],
// then two stages of K [64][QK + 8] and V [64][V + 8]. The 8 extra elements put consecutive
// rows 16 bytes apart modulo 128, so the 8 rows an ldmatrix reads fall in distinct banks.
template <int QK, int V>
struct FlashShape {
  static_assert(QK % 16 == 0 && V % 16 == 0, "head widths are whole k16 / n16 fragments");
  static constexpr int kLdQk = QK + 8;
  static constexpr int kLdV = V + 8;
  static constexpr int kQElems = kQueries * kLdQk;
  static constexpr int kKElems = kKeys * kLdQk;
  static constexpr int kStageElems = kKElems + kKeys * kLdV;
  static constexpr size_t kBytes = static_cast<size_t>(kQElems + 2 * kStageElems) * 2;
};

// Keys [j0, j0 + 64) of head_offset's head into a stage; rows from key_end on are zero.
template <int QK, int V>
__device__ void load_key_step(__nv_bfloat16* stage, const __nv_bfloat16* kv, int64_t kv_width, int head_offset,
                              int j0, int key_end) {
  using S = FlashShape<QK, V>;
  constexpr int kKVecs = QK / 8, kRowVecs = (QK + V) / 8;
  __nv_bfloat16* v_s = stage + S::kKElems;
  for (int i = threadIdx.x; i < kKeys * kRowVecs; i += kThreads) {
    const int j = i / kRowVecs, c = i % kRowVecs, key = j0 + j;
    const bool valid = key < key_end;
    const __nv_bfloat16* src = kv + static_cast<int64_t>(valid ? key : 0) * kv_width + head_offset + c * 8;
    __nv_bfloat16* dst = c < kKVecs ? stage + j * S::kLdQk + c * 8 : v_s + j * S::kLdV + (c - kKVecs) * 8;
    cp_async16(dst, src, valid);
  }
  cp_async_commit();
}

// Block (query block, head): queries [q0, q0 + 64) of the chunk, at positions first_pos + q0 + r,
// against keys 0 .. min(num_keys, their last position + 1). grid.x counts query blocks from
// the last (the longest) so that the heaviest blocks start first. Each thread holds, for rows
// g = lane/4 and g + 8 of its warp's 16, the running max (in log2 units) and its own part of
// the running sum; the quad of a row agrees on the max.
template <int QK, int V>
__global__ void __launch_bounds__(kThreads) flash_attention_kernel(const __nv_bfloat16* q, const __nv_bfloat16* kv,
                                                                   int num_heads, int v_dim, int num_queries,
                                                                   int first_pos, int num_keys, float scale_log2,
                                                                   float* out, int64_t ld_out) {
  await_previous_kernels();
  using S = FlashShape<QK, V>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* stages = q_s + S::kQElems;
  const int num_q_blocks = (num_queries + kQueries - 1) / kQueries;
  const int q0 = (num_q_blocks - 1 - static_cast<int>(blockIdx.x)) * kQueries, h = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rows = min(kQueries, num_queries - q0);
  const int64_t kv_width = static_cast<int64_t>(num_heads) * (QK + V);
  const int head_offset = h * (QK + V);
  const int key_end = min(num_keys, first_pos + q0 + rows);
  const int warp_pos = first_pos + q0 + warp * 16;  // the position of the warp's first row

  for (int i = threadIdx.x; i < kQueries * (QK / 8); i += kThreads) {
    const int r = i / (QK / 8), c = i % (QK / 8);
    const bool valid = r < rows;  // rows past the chunk are zero queries (finite scores, never written)
    cp_async16(q_s + r * S::kLdQk + c * 8, q + (static_cast<int64_t>(valid ? q0 + r : 0) * num_heads + h) * QK + c * 8,
               valid);
  }
  load_key_step<QK, V>(stages, kv, kv_width, head_offset, 0, key_end);  // commits the queries too

  uint32_t q_frag[QK / 16][4];
  float o[V / 8][4];
#pragma unroll
  for (int n = 0; n < V / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  const int num_steps = (key_end + kKeys - 1) / kKeys;
  for (int step = 0; step < num_steps; ++step) {
    const int j0 = step * kKeys;
    const __nv_bfloat16* k_s = stages + (step % 2) * S::kStageElems;
    const __nv_bfloat16* v_s = k_s + S::kKElems;
    cp_async_wait<0>();
    __syncthreads();  // this step's keys are in place, and every warp is done with the other stage
    if (step + 1 < num_steps)
      load_key_step<QK, V>(stages + ((step + 1) % 2) * S::kStageElems, kv, kv_width, head_offset, j0 + kKeys,
                           key_end);
    if (step == 0) {
#pragma unroll
      for (int kk = 0; kk < QK / 16; ++kk)
        ldmatrix_x4(q_s + (warp * 16 + lane % 8 + (lane / 8) % 2 * 8) * S::kLdQk + kk * 16 + lane / 16 * 8,
                    q_frag[kk]);
    }

    // Scores [16 x 64] of the warp's rows: n-tile n holds keys j0 + 8n .. j0 + 8n + 7.
    float s[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < QK / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4(k_s + (np * 16 + lane % 8 + lane / 16 * 8) * S::kLdQk + kk * 16 + (lane / 8) % 2 * 8, b);
        mma_bf16_16x8x16(s[2 * np], q_frag[kk], b[0], b[1]);
        mma_bf16_16x8x16(s[2 * np + 1], q_frag[kk], b[2], b[3]);
      }
    }

    auto score = [&](int n, int e) -> float& { return s[n][e]; };
    scale_and_mask_scores<kKeys>(score, scale_log2, j0, warp_pos, key_end, g, t);
    online_softmax_step<kKeys, V / 8>(score, [&](int n, int e) -> float& { return o[n][e]; }, row_max, row_sum);

    // O [16 x V] += P [16 x 64] · V [64 x V]: n-tiles 2kk and 2kk+1 of the scores make the A
    // fragment of keys 16kk .. 16kk + 15.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t a[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < V / 16; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(v_s + (kk * 16 + lane % 8 + (lane / 8) % 2 * 8) * S::kLdV + dp * 16 + lane / 16 * 8, b);
        mma_bf16_16x8x16(o[2 * dp], a, b[0], b[1]);
        mma_bf16_16x8x16(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }

  // Normalised rows into out [num_queries, heads, v_dim] (rows ld_out floats apart); v_dim is a
  // multiple of 4, so a thread's column pair is whole or past the end.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float sum = row_sum[i];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = warp * 16 + g + i * 8;
    if (r >= rows) continue;
    const float inv = 1.0f / sum;
    float* dst = out + static_cast<int64_t>(q0 + r) * ld_out + static_cast<int64_t>(h) * v_dim;
#pragma unroll
    for (int n = 0; n < V / 8; ++n) {
      const int c = n * 8 + 2 * t;
      if (c < v_dim) *reinterpret_cast<float2*>(dst + c) = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    }
  }
}

template <int QK, int V>
void launch_flash(const uint16_t* queries, const uint16_t* kv, int num_heads, int v_dim, int num_queries,
                  int first_pos, int num_keys, float scale_log2, float* out, int64_t ld_out, Stream stream) {
  constexpr size_t kBytes = FlashShape<QK, V>::kBytes;
  allow_shared_bytes<flash_attention_kernel<QK, V>>(kBytes);
  const dim3 grid((num_queries + kQueries - 1) / kQueries, num_heads);
  launch_kernel(flash_attention_kernel<QK, V>, grid, kThreads, kBytes, stream,
                reinterpret_cast<const __nv_bfloat16*>(queries), reinterpret_cast<const __nv_bfloat16*>(kv), num_heads,
                v_dim, num_queries, first_pos, num_keys, scale_log2, out, ld_out);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace

// The head widths compiled: DeepSeek-V2, V2-Lite and V3 (192 = 128 nope + 64 rope; v 128), and
// the tiny test models' (48, 32).
bool flash_attention_supported(int qk_padded, int v_padded) {
  return (qk_padded == 192 && v_padded == 128) || (qk_padded == 48 && v_padded == 32);
}

void launch_expanded_flash_attention(const uint16_t* queries, const uint16_t* kv, const uint16_t* shared_rope,
                                     int64_t ld_rope, int num_heads, int qk_padded, int v_padded, int v_dim,
                                     int num_queries, int first_pos, int num_keys, float softmax_scale, float* out,
                                     int64_t ld_out, Stream stream) {
  DS_CHECK(flash_attention_supported(qk_padded, v_padded) && v_dim % 4 == 0 && v_dim <= v_padded);
  DS_CHECK(reinterpret_cast<uintptr_t>(queries) % 16 == 0 && reinterpret_cast<uintptr_t>(kv) % 16 == 0);
  if (num_queries == 0) return;
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = softmax_scale * kLog2e;
  if (shared_rope != nullptr)
    launch_flash_attention_wgmma(queries, kv, shared_rope, ld_rope, num_heads, v_dim, num_queries, first_pos,
                                 num_keys, scale_log2, out, ld_out, stream);
  else if (qk_padded == 192)
    launch_flash<192, 128>(queries, kv, num_heads, v_dim, num_queries, first_pos, num_keys, scale_log2, out, ld_out,
                           stream);
  else
    launch_flash<48, 32>(queries, kv, num_heads, v_dim, num_queries, first_pos, num_keys, scale_log2, out, ld_out,
                         stream);
}

}  // namespace dsinfer::cuda
