// Kernels of MLA prefill in the expanded (non-absorbed) form: the gathers of latent entries
// and queries, and the causal softmax that sits between cuBLASLt products (made by
// cuda_backend_mla.cpp) where the fused kernel of mla_flash.cu does not apply. A long prefill
// chunk is cheaper as ordinary multi-head attention over up-projected keys and values (192 +
// 128 multiply-adds per head and query-key pair for V3) than in the absorbed form that decode
// uses (576 + 512).
#include <cuda_bf16.h>

#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/latent_entry.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void gather_latent_kernel(MlaDims d, const void* cache, const int32_t* table, int ld_latent,
                                     uint16_t* latent) {
  await_previous_kernels();
  const int p = blockIdx.x, bs = d.block_size, lora = d.kv_lora_rank, entry = lora + d.qk_rope_head_dim;
  const uint8_t* src = cache_entry(d, cache, static_cast<int64_t>(table[p / bs]) * bs + p % bs);
  __nv_bfloat16* dst = reinterpret_cast<__nv_bfloat16*>(latent) + static_cast<int64_t>(p) * ld_latent;
  for (int c = threadIdx.x; c < ld_latent; c += blockDim.x) {
    const float v = c < lora ? latent_value(d, src, c) : c < entry ? rope_value(d, src, c - lora) : 0.0f;
    dst[c] = __float2bfloat16(v);
  }
}

// The same for an fp32 cache whose entries and latent rows hold whole groups of four columns: a
// thread converts four columns with one 16-byte load and one 8-byte store, and issues the loads
// of its groups before any store (the scalar loop kept one 4-byte load in flight a thread).
constexpr int kGatherGroupsAtOnce = 2;

__global__ void gather_latent_f32_kernel(MlaDims d, const void* cache, const int32_t* table, int ld_latent,
                                         uint16_t* latent) {
  await_previous_kernels();
  const int p = blockIdx.x, bs = d.block_size, entry = d.kv_lora_rank + d.qk_rope_head_dim;
  const int64_t slot = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
  const auto* src = reinterpret_cast<const float4*>(cache_entry(d, cache, slot));
  auto* dst = reinterpret_cast<uint2*>(latent + static_cast<int64_t>(p) * ld_latent);
  const int num_groups = ld_latent / 4, entry_groups = entry / 4;
  for (int g0 = threadIdx.x; g0 < num_groups; g0 += kGatherGroupsAtOnce * blockDim.x) {
    float4 v[kGatherGroupsAtOnce];
#pragma unroll
    for (int u = 0; u < kGatherGroupsAtOnce; ++u) {
      const int g = g0 + u * blockDim.x;
      v[u] = g < entry_groups ? src[g] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kGatherGroupsAtOnce; ++u) {
      const int g = g0 + u * blockDim.x;
      if (g >= num_groups) break;
      const __nv_bfloat162 lo = __floats2bfloat162_rn(v[u].x, v[u].y), hi = __floats2bfloat162_rn(v[u].z, v[u].w);
      dst[g] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    }
  }
}

// One block per token; a thread writes two neighbouring columns of a head (one rotated pair
// in the rope part) as one bf16 pair. The nope and rope widths and qk_padded are even. A thread
// issues the loads of kPairsAtOnce pairs before it converts any: with one load in flight a
// thread, a 4 × 4k prefill's queries moved at 2.6 TB/s.
constexpr int kPairsAtOnce = 4;

__global__ void expanded_queries_kernel(MlaDims d, const float* q, const int32_t* positions, const float* rope_cos,
                                        const float* rope_sin, int qk_padded, uint16_t* q_out) {
  await_previous_kernels();
  const int i = blockIdx.x;
  const int nope = d.qk_nope_head_dim, rope = d.qk_rope_head_dim, half = rope / 2, qk = nope + rope;
  const int pos = positions[i];
  const float* src = q + static_cast<int64_t>(i) * d.num_heads * qk;
  auto* dst = reinterpret_cast<__nv_bfloat162*>(q_out + static_cast<int64_t>(i) * d.num_heads * qk_padded);
  const int pairs_per_head = qk_padded / 2, num_pairs = d.num_heads * pairs_per_head;
  for (int e0 = threadIdx.x; e0 < num_pairs; e0 += kPairsAtOnce * blockDim.x) {
    float2 x[kPairsAtOnce];
    float cs[kPairsAtOnce], sn[kPairsAtOnce];
#pragma unroll
    for (int u = 0; u < kPairsAtOnce; ++u) {
      const int e = e0 + u * blockDim.x, h = e / pairs_per_head, c = 2 * (e % pairs_per_head);
      x[u] = make_float2(0.0f, 0.0f);  // the padding columns past qk
      cs[u] = 1.0f, sn[u] = 0.0f;      // the nope part is not rotated
      if (e >= num_pairs || c >= qk) continue;
      x[u] = *reinterpret_cast<const float2*>(src + h * qk + c);
      if (c >= nope) {
        const int pair = (c - nope) / 2;
        cs[u] = rope_cos[pos * half + pair], sn[u] = rope_sin[pos * half + pair];
      }
    }
#pragma unroll
    for (int u = 0; u < kPairsAtOnce; ++u) {
      const int e = e0 + u * blockDim.x;
      if (e >= num_pairs) break;
      const bool rotated = 2 * (e % pairs_per_head) >= nope;
      const float v0 = rotated ? x[u].x * cs[u] - x[u].y * sn[u] : x[u].x;
      const float v1 = rotated ? x[u].x * sn[u] + x[u].y * cs[u] : x[u].y;
      dst[e] = __floats2bfloat162_rn(v0, v1);
    }
  }
}

// A thread per 8 rope columns (4 rotated pairs, 16 bytes) of a token's head, rotated where they
// are: bf16 in, rotated in fp32 as expanded_queries_kernel does, bf16 out. (A block per token
// with a pair a thread moved 0.74 TB/s.)
constexpr int kRopePieceCols = 8;

__global__ void rope_bf16_queries_kernel(MlaDims d, uint16_t* q, const int32_t* positions, int num_tokens,
                                         const float* rope_cos, const float* rope_sin) {
  await_previous_kernels();
  const int nope = d.qk_nope_head_dim, half = d.qk_rope_head_dim / 2, qk = nope + d.qk_rope_head_dim;
  const int pieces = d.qk_rope_head_dim / kRopePieceCols;  // per head
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(num_tokens) * d.num_heads * pieces) return;
  const int piece = static_cast<int>(i % pieces);
  const int64_t token_head = i / pieces, token = token_head / d.num_heads;
  const int pos = positions[token];
  auto* cols = reinterpret_cast<uint4*>(q + token_head * qk + nope + kRopePieceCols * piece);
  uint4 bits = *cols;
  const float4 cs = *reinterpret_cast<const float4*>(rope_cos + static_cast<int64_t>(pos) * half + 4 * piece);
  const float4 sn = *reinterpret_cast<const float4*>(rope_sin + static_cast<int64_t>(pos) * half + 4 * piece);
  const float c[4] = {cs.x, cs.y, cs.z, cs.w}, s[4] = {sn.x, sn.y, sn.z, sn.w};
  auto* pairs = reinterpret_cast<__nv_bfloat162*>(&bits);
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const float2 x = __bfloat1622float2(pairs[u]);
    pairs[u] = __floats2bfloat162_rn(x.x * c[u] - x.y * s[u], x.x * s[u] + x.y * c[u]);
  }
  *cols = bits;
}

__device__ void merge_max_sum(float& m, float& s, float m2, float s2) {
  const float m_new = fmaxf(m, m2);
  s = (m == -FLT_MAX ? 0.0f : s * exp2f(m - m_new)) + (m2 == -FLT_MAX ? 0.0f : s2 * exp2f(m2 - m_new));
  m = m_new;
}

// One block per (head, query row): online max and sum over the row's visible keys, then the
// normalised probabilities; keys after the query's position get 0. The first kCachedPerThread
// scores of each thread stay in registers between the two passes, so rows of up to 4096 keys
// are read from memory once.
constexpr int kCachedPerThread = 16;

__global__ void __launch_bounds__(kThreads) causal_softmax_kernel(const float* scores, int64_t ld, int rows,
                                                                    int num_keys, int first_query_pos, float scale_log2,
                                                                    uint16_t* probs) {
  await_previous_kernels();
  __shared__ float s_m[kThreads / 32], s_s[kThreads / 32];
  const int64_t r = blockIdx.x;
  const int visible = min(num_keys, first_query_pos + static_cast<int>(r % rows) + 1);
  const float* row = scores + r * ld;
  float cached[kCachedPerThread];
  float m = -FLT_MAX, s = 0.0f;
#pragma unroll
  for (int u = 0; u < kCachedPerThread; ++u) {
    const int j = threadIdx.x + u * kThreads;
    cached[u] = j < visible ? row[j] * scale_log2 : -FLT_MAX;
  }
#pragma unroll
  for (int u = 0; u < kCachedPerThread; ++u)
    if (cached[u] != -FLT_MAX) merge_max_sum(m, s, cached[u], 1.0f);
  for (int j = threadIdx.x + kCachedPerThread * kThreads; j < visible; j += kThreads)
    merge_max_sum(m, s, row[j] * scale_log2, 1.0f);
  for (int off = 16; off > 0; off >>= 1)
    merge_max_sum(m, s, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_m[warp] = m;
    s_s[warp] = s;
  }
  __syncthreads();
  m = -FLT_MAX;
  s = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) merge_max_sum(m, s, s_m[w], s_s[w]);
  const float inv = 1.0f / s;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(probs) + r * ld;
#pragma unroll
  for (int u = 0; u < kCachedPerThread; ++u) {
    const int j = threadIdx.x + u * kThreads;
    if (j < num_keys) out[j] = __float2bfloat16(j < visible ? exp2f(cached[u] - m) * inv : 0.0f);
  }
  for (int j = threadIdx.x + kCachedPerThread * kThreads; j < num_keys; j += kThreads)
    out[j] = __float2bfloat16(j < visible ? exp2f(row[j] * scale_log2 - m) * inv : 0.0f);
}

}  // namespace

void launch_mla_gather_latent(const MlaDims& d, const void* cache, const int32_t* table, int num_positions,
                              int ld_latent, uint16_t* latent, Stream stream) {
  if (num_positions == 0) return;
  const int entry = d.kv_lora_rank + d.qk_rope_head_dim;
  const auto aligned = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  const bool groups_of_four = !d.cache_fp8 && entry % 4 == 0 && ld_latent % 4 == 0 && d.cache_entry_bytes % 16 == 0 &&
                              aligned(cache, 16) && aligned(latent, 8);
  launch_kernel(groups_of_four ? gather_latent_f32_kernel : gather_latent_kernel, num_positions, 128, 0, stream, d,
                cache, table, ld_latent, latent);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_mla_expanded_queries(const MlaDims& d, const float* q, const int32_t* positions, int num_tokens,
                                 const float* rope_cos, const float* rope_sin, int qk_padded, uint16_t* q_out,
                                 Stream stream) {
  DS_CHECK_MSG(d.qk_nope_head_dim % 2 == 0 && d.qk_rope_head_dim % 2 == 0 && qk_padded % 2 == 0,
               "expanded queries: head widths must be even");
  if (num_tokens == 0) return;
  launch_kernel(expanded_queries_kernel, num_tokens, kThreads, 0, stream, d, q, positions, rope_cos, rope_sin,
                qk_padded, q_out);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_mla_rope_bf16_queries(const MlaDims& d, uint16_t* q, const int32_t* positions, int num_tokens,
                                  const float* rope_cos, const float* rope_sin, Stream stream) {
  DS_CHECK_MSG(mla_rope_bf16_queries_supported(d.qk_nope_head_dim, d.qk_rope_head_dim) &&
                   reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(rope_cos) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(rope_sin) % 16 == 0,
               "bf16 queries: rope and nope widths multiples of 8, rows and tables 16-byte aligned");
  if (num_tokens == 0) return;
  const int64_t threads = static_cast<int64_t>(num_tokens) * d.num_heads * (d.qk_rope_head_dim / kRopePieceCols);
  launch_kernel(rope_bf16_queries_kernel, static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0,
                stream, d, q, positions, num_tokens, rope_cos, rope_sin);
  DS_CUDA_CHECK_LAUNCH();
}

bool mla_rope_bf16_queries_supported(int qk_nope, int qk_rope) {
  return qk_nope % kRopePieceCols == 0 && qk_rope % kRopePieceCols == 0;
}

void launch_causal_softmax(const float* scores, int64_t ld, int num_heads, int rows, int num_keys, int first_query_pos,
                           float softmax_scale, uint16_t* probs, Stream stream) {
  if (num_heads * rows == 0) return;
  constexpr float kLog2e = 1.4426950408889634f;
  launch_kernel(causal_softmax_kernel, num_heads * rows, kThreads, 0, stream, scores, ld, rows, num_keys,
                first_query_pos, softmax_scale * kLog2e, probs);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
