// MLA attention on the GPU in the weight-absorbed form over the paged fp32 latent cache
// (the CPU backend's cpu_attention.cpp is the reference).
//
// Work split: one thread block per (split, head, token). A block absorbs W_UK into its query
// (q_lat = q_nope · W_UK[h], 512 wide for V3) and walks its slice of the context with four
// warps; each warp owns every fourth position and keeps an online-softmax state whose latent
// accumulator is spread over the lanes (lane i holds columns i, i+32, …), so a position costs
// one coalesced 576-float read and one warp reduction. A second kernel merges the splits
// (flash-decoding style) and projects through W_UV. Decode batches with long contexts use many
// splits so that 132 SMs have work even for one sequence; prefill uses one split per block.
#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxLora = 512;
constexpr int kMaxRope = 64;
constexpr int kMaxNope = 256;
constexpr int kLoraPerLane = kMaxLora / 32;
constexpr int kRopePerLane = kMaxRope / 32;

__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__global__ void cache_write_kernel(MlaDims d, MlaBatchView b, const float* kv_a, const float* norm_w, float eps,
                                   const float* rope_cos, const float* rope_sin, float* cache) {
  __shared__ float warp_sums[kWarps];
  const int t = blockIdx.x;
  const int lora = d.kv_lora_rank, rope = d.qk_rope_head_dim, entry = lora + rope, half = rope / 2;
  const float* src = kv_a + static_cast<int64_t>(t) * entry;
  float* dst = cache + static_cast<int64_t>(b.slot_mapping[t]) * entry;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < lora; i += kThreads) sum += src[i] * src[i];
  sum = warp_sum(sum);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  const float inv = rsqrtf(total / static_cast<float>(lora) + eps);
  for (int i = threadIdx.x; i < lora; i += kThreads) dst[i] = src[i] * inv * norm_w[i];
  const int pos = b.positions[t];
  for (int i = threadIdx.x; i < half; i += kThreads) {
    const float x0 = src[lora + 2 * i], x1 = src[lora + 2 * i + 1];
    const float c = rope_cos[pos * half + i], s = rope_sin[pos * half + i];
    dst[lora + 2 * i] = x0 * c - x1 * s;
    dst[lora + 2 * i + 1] = x0 * s + x1 * c;
  }
}

__global__ void __launch_bounds__(kThreads) attention_partial_kernel(MlaDims d, MlaBatchView b, const float* q,
                                                                     const float* w_uk, const float* rope_cos,
                                                                     const float* rope_sin, const float* cache,
                                                                     float softmax_scale, int num_splits,
                                                                     int split_len, float* workspace) {
  __shared__ float s_q_nope[kMaxNope];
  __shared__ float s_q_lat[kMaxLora];
  __shared__ float s_q_rope[kMaxRope];
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_acc[kWarps][kMaxLora];
  const int split = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
  const int lora = d.kv_lora_rank, rope = d.qk_rope_head_dim, nope = d.qk_nope_head_dim;
  const int entry = lora + rope, half = rope / 2, bs = d.block_size;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pos = b.positions[t];

  const float* qt = q + static_cast<int64_t>(t) * d.num_heads * (nope + rope) + h * (nope + rope);
  for (int i = threadIdx.x; i < nope; i += kThreads) s_q_nope[i] = qt[i];
  for (int i = threadIdx.x; i < half; i += kThreads) {
    const float x0 = qt[nope + 2 * i], x1 = qt[nope + 2 * i + 1];
    const float c = rope_cos[pos * half + i], s = rope_sin[pos * half + i];
    s_q_rope[2 * i] = x0 * c - x1 * s;
    s_q_rope[2 * i + 1] = x0 * s + x1 * c;
  }
  __syncthreads();
  const float* uk = w_uk + static_cast<int64_t>(h) * nope * lora;  // [nope, lora]
  for (int l = threadIdx.x; l < lora; l += kThreads) {
    float acc = 0.0f;
    for (int i = 0; i < nope; ++i) acc += s_q_nope[i] * uk[static_cast<int64_t>(i) * lora + l];
    s_q_lat[l] = acc;
  }
  __syncthreads();

  float q_lat[kLoraPerLane], q_rope[kRopePerLane], acc[kLoraPerLane];
#pragma unroll
  for (int i = 0; i < kLoraPerLane; ++i) {
    const int l = lane + 32 * i;
    q_lat[i] = l < lora ? s_q_lat[l] : 0.0f;
    acc[i] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kRopePerLane; ++i) {
    const int r = lane + 32 * i;
    q_rope[i] = r < rope ? s_q_rope[r] : 0.0f;
  }

  const int num_ctx = pos + 1;  // causal: positions 0..pos are in the cache by now
  const int begin = split * split_len;
  const int end = min(begin + split_len, num_ctx);
  const int32_t* table = b.tables + b.table_offsets[b.token_seq[t]];
  float m = -FLT_MAX, l_sum = 0.0f;
  for (int s = begin + warp; s < end; s += kWarps) {
    const float* kv = cache + (static_cast<int64_t>(table[s / bs]) * bs + s % bs) * entry;
    float kv_lat[kLoraPerLane];
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < kLoraPerLane; ++i) {
      const int l = lane + 32 * i;
      kv_lat[i] = l < lora ? kv[l] : 0.0f;
      part += q_lat[i] * kv_lat[i];
    }
#pragma unroll
    for (int i = 0; i < kRopePerLane; ++i) {
      const int r = lane + 32 * i;
      if (r < rope) part += q_rope[i] * kv[lora + r];
    }
    const float score = warp_sum(part) * softmax_scale;
    const float m_new = fmaxf(m, score);
    const float corr = expf(m - m_new);
    const float p = expf(score - m_new);
    l_sum = l_sum * corr + p;
#pragma unroll
    for (int i = 0; i < kLoraPerLane; ++i) acc[i] = acc[i] * corr + p * kv_lat[i];
    m = m_new;
  }
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l_sum;
  }
#pragma unroll
  for (int i = 0; i < kLoraPerLane; ++i) {
    const int l = lane + 32 * i;
    if (l < lora) s_acc[warp][l] = acc[i];
  }
  __syncthreads();
  // A warp that saw no position has l_sum 0 and contributes nothing whatever its m.
  float m_all = -FLT_MAX;
  for (int w = 0; w < kWarps; ++w)
    if (s_l[w] > 0.0f) m_all = fmaxf(m_all, s_m[w]);
  float* out = workspace + ((static_cast<int64_t>(t) * d.num_heads + h) * num_splits + split) * (lora + 2);
  for (int l = threadIdx.x; l < lora; l += kThreads) {
    float v = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (s_l[w] > 0.0f) v += s_acc[w][l] * expf(s_m[w] - m_all);
    out[l] = v;
  }
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (s_l[w] > 0.0f) total += s_l[w] * expf(s_m[w] - m_all);
    out[lora] = m_all;
    out[lora + 1] = total;
  }
}

__global__ void __launch_bounds__(kThreads) attention_combine_kernel(MlaDims d, int num_splits, const float* workspace,
                                                                     const float* w_uv, float* out) {
  __shared__ float s_o_lat[kMaxLora];
  const int h = blockIdx.x, t = blockIdx.y;
  const int lora = d.kv_lora_rank, vdim = d.v_head_dim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* parts = workspace + (static_cast<int64_t>(t) * d.num_heads + h) * num_splits * (lora + 2);
  float m_all = -FLT_MAX;
  for (int s = 0; s < num_splits; ++s) {
    const float* p = parts + static_cast<int64_t>(s) * (lora + 2);
    if (p[lora + 1] > 0.0f) m_all = fmaxf(m_all, p[lora]);
  }
  float denom = 0.0f;
  for (int s = 0; s < num_splits; ++s) {
    const float* p = parts + static_cast<int64_t>(s) * (lora + 2);
    if (p[lora + 1] > 0.0f) denom += p[lora + 1] * expf(p[lora] - m_all);
  }
  const float inv = 1.0f / denom;
  for (int l = threadIdx.x; l < lora; l += kThreads) {
    float v = 0.0f;
    for (int s = 0; s < num_splits; ++s) {
      const float* p = parts + static_cast<int64_t>(s) * (lora + 2);
      if (p[lora + 1] > 0.0f) v += p[l] * expf(p[lora] - m_all);
    }
    s_o_lat[l] = v * inv;
  }
  __syncthreads();
  // One warp per output column: a coalesced read of W_UV's row, then a warp reduction.
  for (int v = warp; v < vdim; v += kWarps) {
    const float* row = w_uv + (static_cast<int64_t>(h) * vdim + v) * lora;
    float part = 0.0f;
    for (int l = lane; l < lora; l += 32) part += row[l] * s_o_lat[l];
    part = warp_sum(part);
    if (lane == 0) out[(static_cast<int64_t>(t) * d.num_heads + h) * vdim + v] = part;
  }
}

void check_dims(const MlaDims& d) {
  DS_CHECK_MSG(d.kv_lora_rank <= kMaxLora && d.qk_rope_head_dim <= kMaxRope && d.qk_nope_head_dim <= kMaxNope &&
                   d.qk_rope_head_dim % 2 == 0,
               "MLA dims beyond the CUDA kernel's limits: lora " << d.kv_lora_rank << " rope " << d.qk_rope_head_dim
                                                                 << " nope " << d.qk_nope_head_dim);
}

}  // namespace

void launch_mla_cache_write(const MlaDims& d, const MlaBatchView& b, const float* kv_a, const float* norm_w,
                            float eps, const float* rope_cos, const float* rope_sin, float* cache, Stream stream) {
  check_dims(d);
  if (b.num_tokens == 0) return;
  cache_write_kernel<<<b.num_tokens, kThreads, 0, stream>>>(d, b, kv_a, norm_w, eps, rope_cos, rope_sin, cache);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_mla_attention(const MlaDims& d, const MlaBatchView& b, const float* q, const float* w_uk,
                          const float* w_uv, const float* rope_cos, const float* rope_sin, const float* cache,
                          float softmax_scale, int num_splits, int split_len_tokens, float* workspace, float* out,
                          Stream stream) {
  check_dims(d);
  if (b.num_tokens == 0) return;
  DS_CHECK(num_splits >= 1 && split_len_tokens >= 1 && b.num_tokens <= 65535 && d.num_heads <= 65535);
  const dim3 grid(num_splits, d.num_heads, b.num_tokens);
  attention_partial_kernel<<<grid, kThreads, 0, stream>>>(d, b, q, w_uk, rope_cos, rope_sin, cache, softmax_scale,
                                                          num_splits, split_len_tokens, workspace);
  DS_CUDA_CHECK_LAUNCH();
  const dim3 grid2(d.num_heads, b.num_tokens);
  attention_combine_kernel<<<grid2, kThreads, 0, stream>>>(d, num_splits, workspace, w_uv, out);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
