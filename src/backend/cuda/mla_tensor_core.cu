// Absorbed MLA attention of prefill chunks on tensor cores (query tiles). A thread block owns
// up to 16 consecutive tokens of one head that attend over their sequence's cache; the fp32
// decode kernel of cuda_attention.cu would read the cache once per query token, quadratic in
// traffic for a long prompt. (Decode in head tiles is mla_decode_tiles.cu.)
// The block walks its range of the cache 32 positions at a time: each chunk of latent entries
// is read once for the 16 rows, widened to bf16 in shared memory, and used twice, as keys
// (scores = q_lat·c_kv + q_rope·k_rope, all 576 columns) and as values (the first 512 columns),
// flash-attention style with an online softmax per row. The output is the latent o_lat,
// projected through W_UV by the caller.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/tensor_core.cuh"

namespace dsinfer::cuda {
namespace {

using namespace nvcuda;

constexpr int kTileTokens = 16;
constexpr int kChunk = 32;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxEntry = 576;  // kv_lora_rank + qk_rope_head_dim
constexpr int kMaxLora = 512;
constexpr int kLdEntry = kMaxEntry + 8;  // bf16 rows of queries and cache entries
constexpr int kLdScores = kChunk + 4;
constexpr int kLdProbs = kChunk + 8;
constexpr int kLdOut = kMaxLora + 4;
constexpr int kLoadBatch = 12;  // float4 cache reads in flight per thread (36 per 32-position chunk)

struct Smem {
  __nv_bfloat16 q[kTileTokens][kLdEntry];
  __nv_bfloat16 kv[kChunk][kLdEntry];
  float scores[kTileTokens][kLdScores];
  __nv_bfloat16 probs[kTileTokens][kLdProbs];
  float out[kTileTokens][kLdOut];
  float row_max[kTileTokens], row_sum[kTileTokens], row_scale[kTileTokens];
  int positions[kTileTokens];
};

__device__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Row r < count of the tile is the query of token t0 + r·t_step and head h0 + r·h_step: q_lat |
// rotated q_rope into s.q[r] in bf16 (rows from count on are zero), its position into
// s.positions[r] (-1 past count); the output and softmax state start empty.
__device__ void load_query_rows(Smem& s, const MlaDims& d, const MlaBatchView& b, const float* q,
                                const float* q_latent, const float* rope_cos, const float* rope_sin, int count,
                                int t0, int t_step, int h0, int h_step) {
  const int lora = d.kv_lora_rank, rope = d.qk_rope_head_dim, nope = d.qk_nope_head_dim, half = rope / 2;
  // q_lat rows as float4 reads, all in flight before any is stored (lora is a multiple of 16).
  const int lat_vec = lora / 4;
  for (int base = threadIdx.x; base < kTileTokens * lat_vec; base += kThreads * kLoadBatch) {
    float4 v[kLoadBatch];
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u) {
      const int i = base + u * kThreads, r = i / lat_vec, c = (i % lat_vec) * 4;
      v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i < kTileTokens * lat_vec && r < count) {
        const int t = t0 + r * t_step, h = h0 + r * h_step;
        const int64_t row = static_cast<int64_t>(t) * d.num_heads + h;
        v[u] = __ldg(reinterpret_cast<const float4*>(q_latent + row * lora + c));
      }
    }
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u) {
      const int i = base + u * kThreads, r = i / lat_vec, c = (i % lat_vec) * 4;
      if (i < kTileTokens * lat_vec) {
        __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(&s.q[r][c]);
        dst[0] = __floats2bfloat162_rn(v[u].x, v[u].y);
        dst[1] = __floats2bfloat162_rn(v[u].z, v[u].w);
      }
    }
  }
  // Rotated q_rope.
  for (int i = threadIdx.x; i < kTileTokens * half; i += kThreads) {
    const int r = i / half, j = i % half;
    float x = 0.0f, y = 0.0f;
    if (r < count) {
      const int t = t0 + r * t_step, h = h0 + r * h_step, pos = b.positions[t];
      const float* qr = q + (static_cast<int64_t>(t) * d.num_heads + h) * (nope + rope) + nope;
      const float x0 = qr[2 * j], x1 = qr[2 * j + 1];
      const float cs = rope_cos[pos * half + j], sn = rope_sin[pos * half + j];
      x = x0 * cs - x1 * sn;
      y = x0 * sn + x1 * cs;
    }
    s.q[r][lora + 2 * j] = __float2bfloat16_rn(x);
    s.q[r][lora + 2 * j + 1] = __float2bfloat16_rn(y);
  }
  for (int i = threadIdx.x; i < kTileTokens * lora; i += kThreads) s.out[i / lora][i % lora] = 0.0f;
  if (threadIdx.x < kTileTokens) {
    const int r = threadIdx.x;
    s.positions[r] = r < count ? b.positions[t0 + r * t_step] : -1;
    s.row_max[r] = -FLT_MAX;
    s.row_sum[r] = 0.0f;
  }
  __syncthreads();
}

// The tile's rows attend over cache positions [begin, end) of the sequence with block table
// `table` (each row also stops at its own position): s.out holds the unnormalised output and
// s.row_max / s.row_sum the softmax state (max of scaled scores, sum of exponentials; sum 0 for
// a row that saw no position).
__device__ void attend(Smem& s, const MlaDims& d, const int32_t* table, const float* cache, float softmax_scale,
                       int begin, int end) {
  const int lora = d.kv_lora_rank, entry = lora + d.qk_rope_head_dim, bs = d.block_size;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int c0 = begin; c0 < end; c0 += kChunk) {
    // Cache entries of positions c0 .. c0+31, widened to bf16: float4 reads issued in batches
    // of kLoadBatch per thread before any is used, so that many are in flight at once.
    const int vec_per_row = entry / 4, num_vec = kChunk * vec_per_row;
    for (int base = threadIdx.x; base < num_vec; base += kThreads * kLoadBatch) {
      float4 v[kLoadBatch];
#pragma unroll
      for (int u = 0; u < kLoadBatch; ++u) {
        const int i = base + u * kThreads, j = i / vec_per_row, c = (i % vec_per_row) * 4;
        const int kpos = c0 + j;
        v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < num_vec && kpos < end) {
          const int64_t slot = static_cast<int64_t>(table[kpos / bs]) * bs + kpos % bs;
          v[u] = __ldg(reinterpret_cast<const float4*>(cache + slot * entry + c));
        }
      }
#pragma unroll
      for (int u = 0; u < kLoadBatch; ++u) {
        const int i = base + u * kThreads, j = i / vec_per_row, c = (i % vec_per_row) * 4;
        if (i < num_vec) {
          __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(&s.kv[j][c]);
          dst[0] = __floats2bfloat162_rn(v[u].x, v[u].y);
          dst[1] = __floats2bfloat162_rn(v[u].z, v[u].w);
        }
      }
    }
    __syncthreads();
    // Scores [16 x 32]: warps 0 and 1 take 16 positions each.
    if (warp < 2) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int k = 0; k < entry; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fq;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fk;
        wmma::load_matrix_sync(fq, &s.q[0][k], kLdEntry);
        wmma::load_matrix_sync(fk, &s.kv[warp * 16][k], kLdEntry);
        wmma::mma_sync(acc, fq, fk, acc);
      }
      wmma::store_matrix_sync(&s.scores[0][warp * 16], acc, kLdScores, wmma::mem_row_major);
    }
    __syncthreads();
    // Online softmax: warp w owns rows 4w..4w+3, lane j position c0 + j.
    for (int r = warp * 4; r < warp * 4 + 4; ++r) {
      const int qpos = s.positions[r];
      const int kpos = c0 + lane;
      const bool visible = qpos >= 0 && kpos < end && kpos <= qpos;
      const float score = visible ? s.scores[r][lane] * softmax_scale : -FLT_MAX;
      const float m_old = s.row_max[r];
      const float m_new = fmaxf(m_old, warp_max(score));
      const float p = visible ? expf(score - m_new) : 0.0f;
      const float sum = warp_sum(p);
      s.probs[r][lane] = __float2bfloat16_rn(p);
      if (lane == 0) s.row_scale[r] = advance_softmax_row(s.row_max[r], s.row_sum[r], m_new, sum);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kTileTokens * lora; i += kThreads) s.out[i / lora][i % lora] *= s.row_scale[i / lora];
    __syncthreads();
    // out [16 x lora] += probs [16 x 32] · values [32 x lora]: warp w owns column blocks w, w+4, ...
    for (int f = warp; f < lora / 16; f += kWarps) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, &s.out[0][f * 16], kLdOut, wmma::mem_row_major);
      for (int k = 0; k < kChunk; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fp;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fv;
        wmma::load_matrix_sync(fp, &s.probs[0][k], kLdProbs);
        wmma::load_matrix_sync(fv, &s.kv[k][f * 16], kLdEntry);
        wmma::mma_sync(acc, fp, fv, acc);
      }
      wmma::store_matrix_sync(&s.out[0][f * 16], acc, kLdOut, wmma::mem_row_major);
    }
    __syncthreads();
  }
}

// Query tiles: tiles [num_tiles, 2] (first token, token count); the tokens of a tile belong to
// one sequence and have consecutive positions. Block (head, tile, run): with one run, writes the
// normalised o_lat of its rows; with more, its run's partial results (unnormalised output, max,
// sum: a row that saw no position has sum 0) into workspace [T, H, num_splits, lora + 2].
__global__ void __launch_bounds__(kThreads) prefill_kernel(MlaDims d, MlaBatchView b, const float* q,
                                                           const float* q_latent, const float* rope_cos,
                                                           const float* rope_sin, const float* cache,
                                                           float softmax_scale, const int32_t* tiles,
                                                           int num_splits, float* workspace, float* o_latent) {
  await_previous_kernels();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  const int h = blockIdx.x, tile = blockIdx.y;  // heads of a tile side by side: they share its cache reads
  const int t0 = tiles[2 * tile], count = tiles[2 * tile + 1];
  const int lora = d.kv_lora_rank;
  load_query_rows(s, d, b, q, q_latent, rope_cos, rope_sin, count, t0, 1, h, 0);
  const int32_t* table = b.tables + b.table_offsets[b.token_seq[t0]];
  const int context = s.positions[count - 1] + 1;
  const int run = (context + num_splits - 1) / num_splits;
  const int run_len = (run + kChunk - 1) / kChunk * kChunk;
  const int begin = min(context, static_cast<int>(blockIdx.z) * run_len);
  attend(s, d, table, cache, softmax_scale, begin, min(context, begin + run_len));
  if (num_splits == 1) {
    for (int i = threadIdx.x; i < count * lora; i += kThreads) {
      const int r = i / lora, c = i % lora;
      o_latent[(static_cast<int64_t>(t0 + r) * d.num_heads + h) * lora + c] = s.out[r][c] / s.row_sum[r];
    }
    return;
  }
  auto part = [&](int r) {
    return workspace + ((static_cast<int64_t>(t0 + r) * d.num_heads + h) * num_splits + blockIdx.z) * (lora + 2);
  };
  for (int i = threadIdx.x; i < count * lora; i += kThreads) part(i / lora)[i % lora] = s.out[i / lora][i % lora];
  if (threadIdx.x < count) {
    part(threadIdx.x)[lora] = s.row_max[threadIdx.x];
    part(threadIdx.x)[lora + 1] = s.row_sum[threadIdx.x];
  }
}

}  // namespace

bool mla_tile_shapes_supported(const MlaDims& d) {
  const int entry = d.kv_lora_rank + d.qk_rope_head_dim;
  return d.kv_lora_rank <= kMaxLora && entry <= kMaxEntry && d.kv_lora_rank % 16 == 0 && entry % 16 == 0 &&
         d.qk_rope_head_dim % 2 == 0;
}

bool mla_tiles_supported(const MlaDims& d) { return !d.cache_fp8 && mla_tile_shapes_supported(d); }

void launch_mla_prefill_attention(const MlaDims& d, const MlaBatchView& b, const float* q, const float* q_latent,
                                  const float* rope_cos, const float* rope_sin, const float* cache,
                                  float softmax_scale, const int32_t* tiles, int num_tiles, int num_splits,
                                  float* workspace, float* o_latent, Stream stream) {
  DS_CHECK(mla_tiles_supported(d) && num_tiles <= 65535 && num_splits >= 1 && num_splits <= 65535 &&
           (num_splits == 1 || workspace != nullptr));
  if (num_tiles == 0) return;
  allow_shared_bytes<prefill_kernel>(sizeof(Smem));
  const dim3 grid(d.num_heads, num_tiles, num_splits);
  launch_kernel(prefill_kernel, grid, kThreads, sizeof(Smem), stream, d, b, q, q_latent, rope_cos, rope_sin, cache,
                softmax_scale, tiles, num_splits, workspace, o_latent);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
