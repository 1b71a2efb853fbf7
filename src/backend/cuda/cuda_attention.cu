// MLA attention on the GPU in the weight-absorbed form over the paged fp32 latent cache
// (the CPU backend's cpu_attention.cpp is the reference).
//
// Four kernels: (1) the queries absorb W_UK (q_lat = q_nope · W_UK[h], 512 wide for V3) in a
// per-head GEMM that reads each weight row once per 16 tokens; (2) one thread block per
// (split, head, token) walks its slice of the context with four warps; each warp owns every
// fourth position and keeps an online-softmax state whose latent accumulator is spread over the
// lanes (lane i holds columns i, i+32, …), so a position costs one coalesced 576-float read
// (issued one position ahead) and one warp reduction, or, in grids of one wave, scores four of
// its positions at once (their reads, products and reductions side by side, the state rescaled
// once for the four); (3) the splits are merged flash-decoding
// style into the latent output; (4) that output is projected through W_UV by the same per-head
// GEMM. Decode batches use many splits so that 132 SMs have work even for one sequence. Steps
// of up to four tokens write their cache entries in the launch of (1), in blocks beside the
// product's; steps of one or two tokens merge their splits (3) in the launch of (4), where its
// blocks read their x. Steps of 16 tokens or more (unless batch-invariant) take (1) and (4) on tensor
// cores (head_gemm_tf32.cu) and (2), (3) in the head tiles or query tiles.
#include <algorithm>
#include <cfloat>
#include <cooperative_groups.h>

#include "backend/cuda/bf16_store.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/latent_entry.cuh"
#include "backend/cuda/warp_sum.cuh"
#include "backend/cuda/weight_load.cuh"
#include "core/dtype.h"

namespace dsinfer::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxLora = 512;
constexpr int kMaxRope = 64;
constexpr int kLoraPerLane = kMaxLora / 32;
constexpr int kRopePerLane = kMaxRope / 32;
constexpr int kFewTokens = 4;  // the few-token form of the per-head products takes up to this many tokens
// Steps of this many tokens or more take the per-head products on tensor cores (TF32), as their
// attention does (head tiles or query tiles); smaller ones stay in fp32.
constexpr int kTensorCoreTokens = 16;

// The warp sums of kGroup values at once (a power of two up to 32), each lane's v[j] its part
// of sum j; on return every lane holds every sum. Each exchange passes the partner the half of
// the values it keeps, so the sums take kGroup - 1 + log2(32 / kGroup) shuffles and kGroup
// broadcasts instead of 5 · kGroup, and each sum is added in warp_sum's order (the same bits).
template <int kGroup>
__device__ __forceinline__ void group_sums(float (&v)[kGroup], int lane) {
  static_assert(kGroup >= 2 && kGroup <= 32 && (kGroup & (kGroup - 1)) == 0, "a power of two up to 32");
  int off = 16;
#pragma unroll
  for (int n = kGroup; n > 1; n /= 2, off /= 2) {
    const bool upper = (lane & off) != 0;
#pragma unroll
    for (int k = 0; k < n / 2; ++k) {
      const float keep = upper ? v[k + n / 2] : v[k], send = upper ? v[k] : v[k + n / 2];
      v[k] = keep + __shfl_xor_sync(0xffffffffu, send, off);
    }
  }
#pragma unroll
  for (; off > 0; off /= 2) v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
  // A lane now holds the sum whose index its lane bits 16, 8, … spell (upper halves first).
  const float mine = v[0];
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    int src = 0, o = 16;
#pragma unroll
    for (int n = kGroup; n > 1; n /= 2, o /= 2)
      if (j % n >= n / 2) src += o;
    v[j] = __shfl_sync(0xffffffffu, mine, src);
  }
}

// Token t's cache entry, written by a block of kThreads threads or more: the first kThreads do
// the work, any others only take part in the block's barriers.
__device__ void cache_write_block(const MlaDims& d, const MlaBatchView& b, const MlaCacheWrite& job,
                                  const float* rope_cos, const float* rope_sin, int t) {
  __shared__ float warp_sums[kWarps];
  __shared__ float s_latent[kMaxLora];
  const int lora = d.kv_lora_rank, rope = d.qk_rope_head_dim, entry = lora + rope, half = rope / 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool worker = threadIdx.x < kThreads;
  // What no kernel of the step writes (the batch view, the norm's weight, the rotary table) is
  // read before the wait for the kernels before this one; only kv_a is theirs.
  const int slot = b.slot_mapping[t];
  const int pos = b.positions[t];
  float norm_w_part[kMaxLora / kThreads];
#pragma unroll
  for (int k = 0; k < kMaxLora / kThreads; ++k) {
    const int i = threadIdx.x + k * kThreads;
    norm_w_part[k] = worker && i < lora ? job.norm_w[i] : 0.0f;
  }
  static_assert(kMaxRope / 2 <= kThreads, "a thread per rotated pair");
  const bool rotates = static_cast<int>(threadIdx.x) < half;
  const float cos_i = rotates ? rope_cos[pos * half + threadIdx.x] : 0.0f;
  const float sin_i = rotates ? rope_sin[pos * half + threadIdx.x] : 0.0f;
  await_previous_kernels();
  if (slot < 0) return;  // a padding token of a recorded batch: nothing to store
  const float* src = job.kv_a + static_cast<int64_t>(t) * entry;
  uint8_t* dst = static_cast<uint8_t*>(job.cache) + static_cast<int64_t>(slot) * d.cache_entry_bytes;
  float sum = 0.0f;
  if (worker)
    for (int i = threadIdx.x; i < lora; i += kThreads) sum += src[i] * src[i];
  sum = warp_sum(sum);
  if (lane == 0 && worker) warp_sums[warp] = sum;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  const float inv = rsqrtf(total / static_cast<float>(lora) + job.eps);
#pragma unroll
  for (int k = 0; k < kMaxLora / kThreads; ++k) {
    const int i = threadIdx.x + k * kThreads;
    if (worker && i < lora) s_latent[i] = src[i] * inv * norm_w_part[k];
  }
  __syncthreads();
  if (!worker) return;
  if (d.cache_fp8) {
    // A warp per 128-column tile: its largest magnitude sets the tile's scale.
    for (int tile = warp; tile * kFp8TileColumns < lora; tile += kWarps) {
      const int begin = tile * kFp8TileColumns, end = min(lora, begin + kFp8TileColumns);
      float amax = 0.0f;
      for (int c = begin + lane; c < end; c += 32) amax = fmaxf(amax, fabsf(s_latent[c]));
      for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      const float scale = e4m3_block_scale(amax);
      for (int c = begin + lane; c < end; c += 32)
        dst[c] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(s_latent[c] / scale, __NV_SATFINITE, __NV_E4M3));
      if (lane == 0) reinterpret_cast<float*>(dst + d.cache_scales_offset)[tile] = scale;
    }
  } else {
    for (int i = threadIdx.x; i < lora; i += kThreads) reinterpret_cast<float*>(dst)[i] = s_latent[i];
  }
  if (rotates) {
    const int i = threadIdx.x;
    const float x0 = src[lora + 2 * i], x1 = src[lora + 2 * i + 1];
    // Roundings spelled out: left to the compiler, whether a product fuses into the add depends
    // on the code around it, and the cache's bits (and near-tied greedy picks) with it.
    const float r0 = __fmaf_rn(x0, cos_i, -__fmul_rn(x1, sin_i)), r1 = __fmaf_rn(x1, cos_i, __fmul_rn(x0, sin_i));
    if (d.cache_fp8) {
      auto* rope_dst = reinterpret_cast<__nv_bfloat16*>(dst + d.cache_rope_offset);
      rope_dst[2 * i] = __float2bfloat16_rn(r0);
      rope_dst[2 * i + 1] = __float2bfloat16_rn(r1);
    } else {
      reinterpret_cast<float*>(dst)[lora + 2 * i] = r0;
      reinterpret_cast<float*>(dst)[lora + 2 * i + 1] = r1;
    }
  }
}

__global__ void __launch_bounds__(kThreads) cache_write_kernel(MlaDims d, MlaBatchView b, MlaCacheWrite job,
                                                               const float* rope_cos, const float* rope_sin) {
  cache_write_block(d, b, job, rope_cos, rope_sin, blockIdx.x);
}

// The split kernel's shape: kLora latent and kRope rope columns, kBlock positions a cache block,
// kFp8 the cache format (1 FP8, 0 fp32); 0 (kFp8: -1) takes the value from MlaDims. Why fixed
// forms: with the widths known, a lane's columns of an entry lie at fixed offsets from the
// entry's start, and the bounds checks and the division by the block size fall away (the
// generic form runs about 300 warp instructions a position at batch 1, two fifths of them
// integer: addresses and bounds). Either form reads the same columns in each lane and adds them
// in the same order, so the bits are the same. kGroup (1 or 4): the positions a warp scores at
// once; 4 leaves 127 registers a thread (four blocks an SM), 1 about 95 (five).
template <int kLora, int kRope, int kBlock, int kFp8, int kGroup>
__global__ void __launch_bounds__(kThreads) attention_partial_kernel(MlaDims d, MlaBatchView b, const float* q,
                                                                     const float* q_latent, const float* rope_cos,
                                                                     const float* rope_sin, const void* cache,
                                                                     float softmax_scale, int num_splits,
                                                                     int split_len, int token_base,
                                                                     float* workspace, bool cache_just_written) {
  static_assert(kLora <= kMaxLora && kRope <= kMaxRope, "the kernel's shared rows");
  static_assert(kGroup == 1 || kGroup == 4, "one position a warp at a time, or four");
  __shared__ float s_q_lat[kMaxLora];
  __shared__ float s_q_rope[kMaxRope];
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_acc[kWarps][kMaxLora];
  // Heads vary fastest across blocks: the heads of a token read the same cache entries at about
  // the same time, so a sequence's latent cache comes from memory once and from L2 for the rest.
  const int h = blockIdx.x, t = token_base + blockIdx.y, split = blockIdx.z;
  const int lora = kLora > 0 ? kLora : d.kv_lora_rank, rope = kRope > 0 ? kRope : d.qk_rope_head_dim;
  const int nope = d.qk_nope_head_dim;
  const int half = rope / 2, bs = kBlock > 0 ? kBlock : d.block_size;
  const bool fp8 = kFp8 >= 0 ? kFp8 == 1 : d.cache_fp8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Before the wait for the kernels before this one: everything but the latent query (the
  // product just before). The step's batch view, the query's rope part and the cache entries
  // come from kernels at least two launches back, which have finished when this kernel starts
  // (kernel_launch.cuh), so each warp's first entry is requested here; but for the newest
  // entries where the cache write ran in the launch just before (cache_just_written).
  const int pos = b.positions[t];
  const float* qt = q + static_cast<int64_t>(t) * d.num_heads * (nope + rope) + h * (nope + rope);
  for (int i = threadIdx.x; i < half; i += kThreads) {
    const float x0 = qt[nope + 2 * i], x1 = qt[nope + 2 * i + 1];
    const float c = rope_cos[pos * half + i], s = rope_sin[pos * half + i];
    s_q_rope[2 * i] = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
    s_q_rope[2 * i + 1] = __fmaf_rn(x0, s, __fmul_rn(x1, c));
  }
  const int num_ctx = pos + 1;  // causal: positions 0..pos are in the cache by now
  // split_len 0: this token's context is cut into num_splits equal slices (whole 16-position
  // runs), so short and long requests of one batch each spread over all their splits.
  if (split_len == 0) split_len = (num_ctx + 16 * num_splits - 1) / (16 * num_splits) * 16;
  const int begin = split * split_len;
  const int end = min(begin + split_len, num_ctx);
  const int32_t* table = b.tables + b.table_offsets[b.token_seq[t]];
  // latent_value and rope_value of the entry at position s, for the form's format. Written out
  // rather than called: through those helpers (in either operand order) the FP8 and generic
  // forms, or the head tiles and the gather that share them, compile to other machine code than
  // was measured.
  auto read_entry = [&](int s, float (&lat)[kLoraPerLane], float (&rope_part)[kRopePerLane]) {
    const uint8_t* kv = cache_entry(d, cache, static_cast<int64_t>(table[s / bs]) * bs + s % bs);
    const float* scales = reinterpret_cast<const float*>(kv + d.cache_scales_offset);
    const auto* rope_bf16 = reinterpret_cast<const __nv_bfloat16*>(kv + d.cache_rope_offset);
#pragma unroll
    for (int i = 0; i < kLoraPerLane; ++i) {
      const int l = lane + 32 * i;
      if (l >= lora) lat[i] = 0.0f;
      else if (fp8) lat[i] = fp8_to_float(kv[l]) * scales[l / kFp8TileColumns];
      else lat[i] = reinterpret_cast<const float*>(kv)[l];
    }
#pragma unroll
    for (int i = 0; i < kRopePerLane; ++i) {
      const int r = lane + 32 * i;
      if (r >= rope) rope_part[i] = 0.0f;
      else if (fp8) rope_part[i] = __bfloat162float(rope_bf16[r]);
      else rope_part[i] = reinterpret_cast<const float*>(kv)[lora + r];
    }
  };
  // With the cache just written (by the launch before this one, beside the W_UK product), the
  // entries of a step's new tokens, at most kFewTokens positions up to pos, are read after the
  // wait; older entries before it.
  const auto readable_early = [&](int s) { return !cache_just_written || s + kFewTokens <= pos; };
  // A warp's positions: begin + warp, then every kWarps-th. kGroup of them form a group.
  const int first = begin + warp;
  float lat[kGroup][kLoraPerLane], rope_part[kGroup][kRopePerLane];
  unsigned read_before_wait = 0;  // bit j: the first group's entry j is in lat[j] already
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    const int s = first + j * kWarps;
    if (s < end && readable_early(s)) {
      read_entry(s, lat[j], rope_part[j]);
      read_before_wait |= 1u << j;
    }
  }
  await_previous_kernels();

  const float* ql = q_latent + (static_cast<int64_t>(t) * d.num_heads + h) * lora;
  for (int i = threadIdx.x; i < lora; i += kThreads) s_q_lat[i] = ql[i];
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

  // Roundings spelled out below, so that every form of the kernel rounds alike (left to the
  // compiler, which product fuses into an add depends on the code around it).
  float m = -FLT_MAX, l_sum = 0.0f;
  if constexpr (kGroup == 1) {
    // A warp's positions form a chain (score, then the running softmax), so the next position's
    // entry is read while the current one is used: each step waits for one memory round trip
    // less.
    if (first < end && read_before_wait == 0) read_entry(first, lat[0], rope_part[0]);
    for (int s = first; s < end; s += kWarps) {
      float kv_lat[kLoraPerLane], kv_rope[kRopePerLane];
#pragma unroll
      for (int i = 0; i < kLoraPerLane; ++i) kv_lat[i] = lat[0][i];
#pragma unroll
      for (int i = 0; i < kRopePerLane; ++i) kv_rope[i] = rope_part[0][i];
      if (s + kWarps < end) read_entry(s + kWarps, lat[0], rope_part[0]);
      float part = 0.0f;
#pragma unroll
      for (int i = 0; i < kLoraPerLane; ++i) part = __fmaf_rn(q_lat[i], kv_lat[i], part);
#pragma unroll
      for (int i = 0; i < kRopePerLane; ++i)
        if (lane + 32 * i < rope) part = __fmaf_rn(q_rope[i], kv_rope[i], part);
      const float score = __fmul_rn(warp_sum(part), softmax_scale);
      // The accumulator is rescaled only when the maximum grows (the score is the same in every
      // lane, so the branch is the warp's); otherwise the factor is exactly 1 (expf(0)), and
      // leaving it out gives the same bits.
      float corr = 1.0f;
      if (score > m) {
        corr = expf(m - score);
#pragma unroll
        for (int i = 0; i < kLoraPerLane; ++i) acc[i] = __fmul_rn(acc[i], corr);
        m = score;
      }
      const float p = expf(score - m);
      l_sum = __fmaf_rn(l_sum, corr, p);
#pragma unroll
      for (int i = 0; i < kLoraPerLane; ++i) acc[i] = __fmaf_rn(p, kv_lat[i], acc[i]);
    }
  } else {
    // kGroup positions at a time: their scores are independent, so their reads, products and
    // warp sums overlap, the sums share their shuffles (group_sums), and the running softmax
    // rescales once a group instead of once a position.
    for (int s0 = first; s0 < end; s0 += kGroup * kWarps) {
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        const int s = s0 + j * kWarps;
        if (s0 == first && (read_before_wait >> j & 1u)) continue;
        if (s < end) {
          read_entry(s, lat[j], rope_part[j]);
        } else {
#pragma unroll
          for (int i = 0; i < kLoraPerLane; ++i) lat[j][i] = 0.0f;
#pragma unroll
          for (int i = 0; i < kRopePerLane; ++i) rope_part[j][i] = 0.0f;
        }
      }
      float part[kGroup];
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        part[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < kLoraPerLane; ++i) part[j] = __fmaf_rn(q_lat[i], lat[j][i], part[j]);
#pragma unroll
        for (int i = 0; i < kRopePerLane; ++i)
          if (lane + 32 * i < rope) part[j] = __fmaf_rn(q_rope[i], rope_part[j][i], part[j]);
      }
      group_sums<kGroup>(part, lane);
      float score[kGroup], m_new = m;
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        score[j] = __fmul_rn(part[j], softmax_scale);
        if (s0 + j * kWarps < end) m_new = fmaxf(m_new, score[j]);
      }
      if (m_new > m) {  // as in the form above: a factor of 1 is left out
        const float corr = expf(m - m_new);
        l_sum = __fmul_rn(l_sum, corr);
#pragma unroll
        for (int i = 0; i < kLoraPerLane; ++i) acc[i] = __fmul_rn(acc[i], corr);
      }
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        const float p = s0 + j * kWarps < end ? expf(score[j] - m_new) : 0.0f;
        l_sum = __fadd_rn(l_sum, p);
#pragma unroll
        for (int i = 0; i < kLoraPerLane; ++i) acc[i] = __fmaf_rn(p, lat[j][i], acc[i]);
      }
      m = m_new;
    }
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
      if (s_l[w] > 0.0f) v = __fmaf_rn(s_acc[w][l], expf(s_m[w] - m_all), v);
    out[l] = v;
  }
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (s_l[w] > 0.0f) total = __fmaf_rn(s_l[w], expf(s_m[w] - m_all), total);
    out[lora] = m_all;
    out[lora + 1] = total;
  }
}

constexpr int kMaxSplits = kMaxMlaSplits;
constexpr int kCombineWarps = 8;
constexpr int kCombineCols = 64;  // columns of a combine block: two per lane

// The merged, normalised latent output of tokens t0 .. t0 + num_tokens - 1 (at most kTokens)
// of head h at columns [64 col_group, + 64), flash-decoding style: warp r turns token r's
// splits' (max, sum) pairs into one weight per split; then warp w adds splits w, w + 8, … of
// each token's columns (two per lane, so a split's row is one coalesced read), and the eight
// warps' sums are added in warp order. The order depends on num_splits only, and a token's
// sums are the same whichever warp weighs them and whatever tokens share the call. Every read
// of every token is requested at once (a split past num_splits reads the last one again,
// unused): read where they are added, each read waited for the sum before it, a round trip
// through L2 a split. Every thread of the block's eight warps calls it (two barriers), with
// shared s_weight [kTokens][kSplits] and s_sum [kTokens][kCombineWarps][32]; on return lane
// l of warp r < num_tokens holds token r's columns 2l and 2l + 1 (where they lie within the
// latent), the other warps nothing. num_splits is at most kSplits, whose registers a thread
// holds for each token (kSplits / 8 pairs): long contexts' form takes up to kMaxMlaLongSplits.
template <int kTokens, int kSplits = kMaxSplits>
__device__ __forceinline__ float2 merge_split_columns(const MlaDims& d, int num_splits, const float* workspace, int t0,
                                                      int num_tokens, int h, int col_group,
                                                      float (*s_weight)[kSplits],
                                                      float2 (*s_sum)[kCombineWarps][32]) {
  static_assert(kTokens >= 1 && kTokens <= kCombineWarps, "a warp weighs each token's splits");
  static_assert(kSplits % 32 == 0 && kSplits % kCombineWarps == 0, "whole passes of the lanes and warps");
  constexpr int kLanePasses = kSplits / 32;  // splits a lane weighs
  const int lora = d.kv_lora_rank;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto split_row = [&](int t, int s) {
    const int64_t part = (static_cast<int64_t>(t0 + t) * d.num_heads + h) * num_splits + min(s, num_splits - 1);
    return workspace + part * (lora + 2);
  };
  constexpr int kSplitsPerWarp = kSplits / kCombineWarps;
  const int col = col_group * kCombineCols + 2 * lane;
  float2 p[kTokens][kSplitsPerWarp];
#pragma unroll
  for (int t = 0; t < kTokens; ++t)
    if (t < num_tokens) {
#pragma unroll
      for (int i = 0; i < kSplitsPerWarp; ++i)
        p[t][i] = *reinterpret_cast<const float2*>(split_row(t, warp + kCombineWarps * i) + min(col, lora - 2));
    }
  if (warp < num_tokens) {
    const int t = warp;
    float m[kLanePasses], l[kLanePasses];
#pragma unroll
    for (int j = 0; j < kLanePasses; ++j) {
      const float* row = split_row(t, lane + 32 * j);
      m[j] = row[lora];
      l[j] = row[lora + 1];
    }
    float m_all = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < kLanePasses; ++j) {
      const bool used = lane + 32 * j < num_splits && l[j] > 0.0f;
      m[j] = used ? m[j] : -FLT_MAX;
      l[j] = used ? l[j] : 0.0f;
      m_all = fmaxf(m_all, m[j]);
    }
    for (int off = 16; off > 0; off >>= 1) m_all = fmaxf(m_all, __shfl_xor_sync(0xffffffffu, m_all, off));
    float e[kLanePasses], denom = 0.0f;
#pragma unroll
    for (int j = 0; j < kLanePasses; ++j) {
      e[j] = l[j] > 0.0f ? expf(m[j] - m_all) : 0.0f;
      denom += l[j] * e[j];
    }
    denom = warp_sum(denom);
#pragma unroll
    for (int j = 0; j < kLanePasses; ++j)
      if (lane + 32 * j < num_splits) s_weight[t][lane + 32 * j] = e[j] / denom;
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t >= num_tokens) break;
    float2 v = make_float2(0.0f, 0.0f);
    if (col < lora) {
#pragma unroll
      for (int i = 0; i < kSplitsPerWarp; ++i) {
        const int s = warp + kCombineWarps * i;
        if (s < num_splits && s_weight[t][s] != 0.0f) {
          v.x += p[t][i].x * s_weight[t][s];
          v.y += p[t][i].y * s_weight[t][s];
        }
      }
    }
    s_sum[t][warp][lane] = v;
  }
  __syncthreads();
  float2 total = make_float2(0.0f, 0.0f);
  if (warp < num_tokens && col < lora) {
    const int t = warp;
    total = s_sum[t][0][lane];
#pragma unroll
    for (int w = 1; w < kCombineWarps; ++w) {
      total.x += s_sum[t][w][lane].x;
      total.y += s_sum[t][w][lane].y;
    }
  }
  return total;
}

// Merges the splits of each (token, head) into the normalised latent output o_lat [T, H, lora]:
// block (token, head, 64-column group); up to kSplits splits.
template <int kSplits>
__global__ void __launch_bounds__(kCombineWarps * 32) attention_combine_kernel(MlaDims d, int num_splits,
                                                                             const float* workspace,
                                                                             float* o_latent) {
  await_previous_kernels();
  __shared__ float s_weight[1][kSplits];
  __shared__ float2 s_sum[1][kCombineWarps][32];
  const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x % 32;
  const float2 total =
      merge_split_columns<1, kSplits>(d, num_splits, workspace, t, 1, h, blockIdx.z, s_weight, s_sum);
  const int col = blockIdx.z * kCombineCols + 2 * lane;
  if (threadIdx.x < 32 && col < d.kv_lora_rank)
    *reinterpret_cast<float2*>(o_latent + (static_cast<int64_t>(t) * d.num_heads + h) * d.kv_lora_rank + col) = total;
}

constexpr int kHeadGemmTokens = 16;
constexpr int kHeadGemmColsPerLane = 2;
constexpr int kHeadGemmCols = 32 * kHeadGemmColsPerLane;
constexpr int kHeadGemmWarps = 8;
constexpr int kMaxHeadGemmK = 512;
// Floats per k row of the transposed x tile: 16 tokens + 4, so that 16-byte reads stay aligned
// and the transposing writes spread over the banks.
constexpr int kHeadGemmLdX = kHeadGemmTokens + 4;
constexpr size_t kHeadGemmSharedBytes =
    std::max(sizeof(float) * kMaxHeadGemmK * kHeadGemmLdX,
             sizeof(float) * kHeadGemmWarps * kHeadGemmTokens * kHeadGemmCols);

// y[t, h, n] = sum_k x[t, h, k] · w[h, k, n] for every head: the absorption of W_UK into the
// queries and of W_UV into the outputs. A block owns 16 tokens × 64 columns of one head; its
// eight warps take every eighth k, and a lane holds two columns for all 16 tokens, so each k
// costs it one pair of weight reads (a warp's pairs form one 256-byte line) and four 16-byte
// broadcast reads of the tokens' x (kept transposed in shared memory) for 32 multiply-adds.
// The warps' partial sums are added in warp order, so every output sums over k in the same
// order whatever the batch.
__global__ void __launch_bounds__(kHeadGemmWarps * 32) head_gemm_kernel(const float* x, int64_t x_token_stride,
                                                                      int64_t x_head_stride, const float* w, int k,
                                                                      int n, float* y, int64_t y_token_stride,
                                                                      int64_t y_head_stride, int num_tokens) {
  await_previous_kernels();
  extern __shared__ __align__(16) float smem_f[];
  float* s_xt = smem_f;    // [k][kHeadGemmLdX]: x of the block's tokens, transposed
  float* s_part = smem_f;  // [warp][token][kHeadGemmCols], once s_xt is read
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col0 = blockIdx.x * kHeadGemmCols + lane * kHeadGemmColsPerLane, h = blockIdx.y;
  const int t0 = blockIdx.z * kHeadGemmTokens;
  const int rows = min(kHeadGemmTokens, num_tokens - t0);
  for (int i = threadIdx.x; i < kHeadGemmTokens * k; i += kHeadGemmWarps * 32) {
    const int r = i / k, c = i % k;
    s_xt[c * kHeadGemmLdX + r] = r < rows ? x[(t0 + r) * x_token_stride + h * x_head_stride + c] : 0.0f;
  }
  __syncthreads();
  float acc[kHeadGemmTokens][kHeadGemmColsPerLane];
#pragma unroll
  for (int r = 0; r < kHeadGemmTokens; ++r) acc[r][0] = acc[r][1] = 0.0f;
  if (col0 < n) {
    const bool pair = col0 + 1 < n;
    const float* wh = w + static_cast<int64_t>(h) * k * n + col0;
#pragma unroll 2
    for (int c = warp; c < k; c += kHeadGemmWarps) {
      const float w0 = __ldg(wh + static_cast<int64_t>(c) * n);
      const float w1 = pair ? __ldg(wh + static_cast<int64_t>(c) * n + 1) : 0.0f;
      const float4* xc = reinterpret_cast<const float4*>(s_xt + c * kHeadGemmLdX);
#pragma unroll
      for (int q = 0; q < kHeadGemmTokens / 4; ++q) {
        const float4 xv = xc[q];
        acc[4 * q][0] += xv.x * w0;
        acc[4 * q][1] += xv.x * w1;
        acc[4 * q + 1][0] += xv.y * w0;
        acc[4 * q + 1][1] += xv.y * w1;
        acc[4 * q + 2][0] += xv.z * w0;
        acc[4 * q + 2][1] += xv.z * w1;
        acc[4 * q + 3][0] += xv.w * w0;
        acc[4 * q + 3][1] += xv.w * w1;
      }
    }
  }
  __syncthreads();  // s_xt is read: its memory takes the partial sums
#pragma unroll
  for (int r = 0; r < kHeadGemmTokens; ++r)
    *reinterpret_cast<float2*>(s_part + (warp * kHeadGemmTokens + r) * kHeadGemmCols + lane * kHeadGemmColsPerLane) =
        make_float2(acc[r][0], acc[r][1]);
  __syncthreads();
  for (int i = threadIdx.x; i < kHeadGemmTokens * kHeadGemmCols; i += kHeadGemmWarps * 32) {
    const int r = i / kHeadGemmCols, c = i % kHeadGemmCols;
    const int out_col = blockIdx.x * kHeadGemmCols + c;
    if (r >= rows || out_col >= n) continue;
    float v = s_part[r * kHeadGemmCols + c];
#pragma unroll
    for (int q = 1; q < kHeadGemmWarps; ++q) v += s_part[(q * kHeadGemmTokens + r) * kHeadGemmCols + c];
    y[(t0 + r) * y_token_stride + h * y_head_stride + out_col] = v;
  }
}

constexpr int kFewWarps = 8;
constexpr int kFewRowsPerWarp = 8;
constexpr int kFewRows = kFewWarps * kFewRowsPerWarp;  // k rows of one block
constexpr int kFewCols = 128;                           // columns of one block: a float4 per lane
constexpr int kMaxFewSlices = 8;                        // k slices per cluster (the portable limit)

// The cache write of a step, where it runs in the blocks of the W_UK product's last column
// group (job.kv_a null: it does not).
struct CacheWriteBeside {
  MlaDims d;
  MlaBatchView b;
  MlaCacheWrite job;
  const float* rope_cos;
  const float* rope_sin;
};

// The splits of a step's attention, merged where the W_UV product reads its x in
// head_gemm_few_kernel instead of by attention_combine_kernel before it: a link fewer in the
// chain. A slice of that product's k is a combine block's 64 columns, so each block merges its
// own slice of each token's head with the combine's arithmetic (the same bits) into its x,
// which is then not read (nor o_latent written). workspace null: x is read as it is.
struct SplitMergeBeside {
  MlaDims d;
  int num_splits = 0;
  const float* workspace = nullptr;
};

// head_gemm_kernel's product for a step of at most four tokens, where it is a pure weight read:
// block (column group, head, k slice) reads 64 weight rows × 128 columns, a 16-byte load per
// lane and row, all eight of a warp's loads in flight at once, so the whole weight (fp32, some
// MB per layer) is requested in about one round trip instead of one per 32 rows. The k slices
// of a (column group, head) form a thread-block cluster and add their partial sums through
// distributed shared memory in slice order: the result does not depend on the token count.
__global__ void __launch_bounds__(kFewWarps * 32) head_gemm_few_kernel(const float* x, int64_t x_token_stride,
                                                                      int64_t x_head_stride, const float* w, int k,
                                                                      int n, float* y, int64_t y_token_stride,
                                                                      int64_t y_head_stride, int num_tokens,
                                                                      uint16_t* y_bf16, int64_t ld_y_bf16,
                                                                      CacheWriteBeside beside, SplitMergeBeside merge,
                                                                      bool weights_evict_first) {
  namespace cg = cooperative_groups;
  // The cache write's blocks: (last column group, head, slice) is token head * slices + slice.
  // A cluster is the slices of one (column group, head), so these blocks form clusters of
  // their own, which never meet at the product's cluster barriers.
  if (beside.job.kv_a != nullptr && blockIdx.x == gridDim.x - 1) {
    const int t = static_cast<int>(blockIdx.y * gridDim.z + blockIdx.z);
    if (t < beside.b.num_tokens) {
      cache_write_block(beside.d, beside.b, beside.job, beside.rope_cos, beside.rope_sin, t);
    } else {
      await_previous_kernels();
    }
    return;
  }
  __shared__ float s_x[kFewTokens][kFewRows];
  __shared__ float4 s_part[kFewWarps][kFewTokens][32];
  __shared__ float4 s_block[kFewTokens][32];
  const cg::cluster_group cluster = cg::this_cluster();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.y, slice = blockIdx.z, k0 = slice * kFewRows;
  const int col = blockIdx.x * kFewCols + 4 * lane;
  // The weight is written by no kernel: its rows are requested before the wait for the kernels
  // before this one, so that with overlapped launches they arrive while those finish.
  float4 wv[kFewRowsPerWarp];
  if (col < n) {
    const float* wh = w + static_cast<int64_t>(h) * k * n + col;
    const uint64_t policy = weight_l2_policy(weights_evict_first);
#pragma unroll
    for (int j = 0; j < kFewRowsPerWarp; ++j) {
      const int kk = k0 + warp * kFewRowsPerWarp + j;
      const uint4 v = load_weight_piece_if(kk < k, wh + static_cast<int64_t>(kk) * n, policy);
      wv[j] = make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
    }
  }
  await_previous_kernels();
  const bool merged = merge.workspace != nullptr;
  for (int i = threadIdx.x; i < kFewTokens * kFewRows; i += kFewWarps * 32) {
    const int r = i / kFewRows, c = i % kFewRows;
    const bool read = r < num_tokens && k0 + c < k && !merged;
    s_x[r][c] = read ? x[r * x_token_stride + h * x_head_stride + k0 + c] : 0.0f;
  }
  if (merged) {
    static_assert(kFewRows == kCombineCols && kFewWarps == kCombineWarps, "a slice of k is a combine block");
    __shared__ float s_weight[kFewTokens][kMaxSplits];
    __shared__ float2 s_sum[kFewTokens][kCombineWarps][32];
    // One token takes the form of one token's registers (the combine kernel's), more the form
    // that requests every token's reads at once.
    const float2 v = num_tokens == 1
                         ? merge_split_columns<1>(merge.d, merge.num_splits, merge.workspace, 0, 1, h, slice,
                                                  s_weight, s_sum)
                         : merge_split_columns<kFewTokens>(merge.d, merge.num_splits, merge.workspace, 0,
                                                           num_tokens, h, slice, s_weight, s_sum);
    const int c = 2 * lane;
    if (warp < num_tokens && k0 + c < k) {  // warp r holds token r's columns; k (the latent width) is even
      s_x[warp][c] = v.x;
      s_x[warp][c + 1] = v.y;
    }
  }
  __syncthreads();
  float4 acc[kFewTokens];
#pragma unroll
  for (int r = 0; r < kFewTokens; ++r) acc[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (col < n) {
#pragma unroll
    for (int j = 0; j < kFewRowsPerWarp; ++j) {
#pragma unroll
      for (int r = 0; r < kFewTokens; ++r) {
        const float xv = s_x[r][warp * kFewRowsPerWarp + j];
        acc[r].x += xv * wv[j].x;
        acc[r].y += xv * wv[j].y;
        acc[r].z += xv * wv[j].z;
        acc[r].w += xv * wv[j].w;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kFewTokens; ++r) s_part[warp][r][lane] = acc[r];
  __syncthreads();
  if (threadIdx.x < kFewTokens * 32) {
    const int r = threadIdx.x / 32, l = threadIdx.x % 32;
    float4 v = s_part[0][r][l];
#pragma unroll
    for (int q = 1; q < kFewWarps; ++q) {
      v.x += s_part[q][r][l].x;
      v.y += s_part[q][r][l].y;
      v.z += s_part[q][r][l].z;
      v.w += s_part[q][r][l].w;
    }
    s_block[r][l] = v;
  }
  cluster.sync();
  // Block `slice` of the cluster finishes every num_slices-th (token, lane) entry.
  const int num_slices = static_cast<int>(cluster.num_blocks());
  for (int i = slice + num_slices * static_cast<int>(threadIdx.x); i < kFewTokens * 32;
       i += num_slices * kFewWarps * 32) {
    const int r = i / 32, l = i % 32;
    const int out_col = blockIdx.x * kFewCols + 4 * l;
    if (r >= num_tokens || out_col >= n) continue;
    float4 v = cluster.map_shared_rank(&s_block[0][0], 0)[i];
    for (int q = 1; q < num_slices; ++q) {
      const float4 p = cluster.map_shared_rank(&s_block[0][0], q)[i];
      v.x += p.x;
      v.y += p.y;
      v.z += p.z;
      v.w += p.w;
    }
    *reinterpret_cast<float4*>(y + r * y_token_stride + h * y_head_stride + out_col) = v;
    if (y_bf16 != nullptr)
      store_bf16x4(reinterpret_cast<__nv_bfloat16*>(y_bf16 + r * ld_y_bf16 + h * y_head_stride + out_col), v);
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
}

// Slices of k per (column group, head) of head_gemm_few_kernel.
int few_form_slices(int k) { return (k + kFewRows - 1) / kFewRows; }

// Whether a product of launch_head_gemm takes head_gemm_few_kernel.
bool takes_few_token_form(int64_t x_token_stride, const float* w, int n, const float* y, int64_t y_token_stride,
                          int64_t y_head_stride, int num_tokens, bool fast_forms) {
  const bool aligned = n % 4 == 0 && x_token_stride % 4 == 0 && y_token_stride % 4 == 0 && y_head_stride % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  return fast_forms && num_tokens <= kFewTokens && aligned;
}

// fast_forms: steps of up to four tokens may take head_gemm_few_kernel, steps of kTensorCoreTokens
// or more the TF32 kernel (summation orders that differ from head_gemm_kernel's; not for
// batch-invariant steps). Those also write y rounded to bf16 into y_bf16 (row stride ld_y_bf16)
// where it is given; returns whether one did.
// A cache write beside (only where that kernel is taken, with a block per token: num_heads x
// slices blocks or more) runs in one more column group of its blocks.
bool launch_head_gemm(const float* x, int64_t x_token_stride, int64_t x_head_stride, const float* w, int num_heads,
                      int k, int n, float* y, int64_t y_token_stride, int64_t y_head_stride, int num_tokens,
                      bool fast_forms, Stream stream, uint16_t* y_bf16 = nullptr, int64_t ld_y_bf16 = 0,
                      const CacheWriteBeside& beside = {}, const SplitMergeBeside& merge = {},
                      bool weights_evict_first = false) {
  DS_CHECK_MSG(k <= kMaxHeadGemmK, "MLA absorption width " << k << " beyond the CUDA kernel's limit");
  const bool with_cache_write = beside.job.kv_a != nullptr;
  if (takes_few_token_form(x_token_stride, w, n, y, y_token_stride, y_head_stride, num_tokens, fast_forms)) {
    const int num_slices = few_form_slices(k);
    static_assert(kMaxHeadGemmK <= kMaxFewSlices * kFewRows);
    DS_CHECK(!with_cache_write || num_heads * num_slices >= num_tokens);
    const dim3 grid((n + kFewCols - 1) / kFewCols + (with_cache_write ? 1 : 0), num_heads, num_slices);
    const bool bf16_fits = y_bf16 != nullptr && ld_y_bf16 % 4 == 0 && reinterpret_cast<uintptr_t>(y_bf16) % 8 == 0;
    launch_cluster_kernel(head_gemm_few_kernel, grid, kFewWarps * 32, dim3(1, 1, num_slices), stream, x,
                          x_token_stride, x_head_stride, w, k, n, y, y_token_stride, y_head_stride, num_tokens,
                          bf16_fits ? y_bf16 : nullptr, ld_y_bf16, beside, merge, weights_evict_first);
    return bf16_fits;
  }
  DS_CHECK(!with_cache_write && merge.workspace == nullptr);
  if (fast_forms && num_tokens >= kTensorCoreTokens &&
      head_gemm_tf32_supported(x, x_token_stride, x_head_stride, w, k, n, y, y_token_stride, y_head_stride))
    return launch_head_gemm_tf32(x, x_token_stride, x_head_stride, w, num_heads, k, n, y, y_token_stride,
                                 y_head_stride, num_tokens, y_bf16, ld_y_bf16, stream);
  const int64_t token_tiles = (num_tokens + kHeadGemmTokens - 1) / kHeadGemmTokens;
  DS_CHECK(token_tiles <= 65535 && num_heads <= 65535);
  const dim3 grid((n + kHeadGemmCols - 1) / kHeadGemmCols, num_heads, static_cast<unsigned>(token_tiles));
  static_assert(kHeadGemmSharedBytes <= 48 * 1024, "within a launch's default shared memory");
  launch_kernel(head_gemm_kernel, grid, kHeadGemmWarps * 32, kHeadGemmSharedBytes, stream, x, x_token_stride,
                x_head_stride, w, k, n, y, y_token_stride, y_head_stride, num_tokens);
  DS_CUDA_CHECK_LAUNCH();
  return false;
}

void check_dims(const MlaDims& d) {
  DS_CHECK_MSG(d.kv_lora_rank <= kMaxLora && d.qk_rope_head_dim <= kMaxRope && d.qk_nope_head_dim <= kMaxHeadGemmK &&
                   d.qk_rope_head_dim % 2 == 0 && d.kv_lora_rank % 2 == 0,
               "MLA dims beyond the CUDA kernel's limits: lora " << d.kv_lora_rank << " rope " << d.qk_rope_head_dim
                                                                 << " nope " << d.qk_nope_head_dim);
}

}  // namespace

void launch_mla_cache_write(const MlaDims& d, const MlaBatchView& b, const MlaCacheWrite& job,
                            const float* rope_cos, const float* rope_sin, Stream stream) {
  check_dims(d);
  if (b.num_tokens == 0) return;
  launch_kernel(cache_write_kernel, b.num_tokens, kThreads, 0, stream, d, b, job, rope_cos, rope_sin);
  DS_CUDA_CHECK_LAUNCH();
}

bool launch_mla_attention(const MlaDims& d, const MlaBatchView& b, const float* q, const float* w_uk,
                          const float* w_uv_t, const float* rope_cos, const float* rope_sin, const void* cache,
                          float softmax_scale, int num_splits, int split_len_tokens, float* workspace,
                          float* q_latent, float* o_latent, float* out, const int32_t* prefill_tiles,
                          int num_prefill_tiles, int head_tile_blocks, int32_t* work_starts, bool fast_forms,
                          Stream stream, uint16_t* out_bf16, int64_t ld_out_bf16, const MlaCacheWrite* cache_write,
                          bool fixed_split_forms, int split_group_positions, bool few_token_tiles,
                          bool few_token_tiles_early, int merge_beside_max_tokens, bool weights_evict_first) {
  check_dims(d);
  if (b.num_tokens == 0) return false;
  // Only the few-token tiles' runs go past the split kernel's most, merged by the combine kernel.
  DS_CHECK(num_splits >= 1 && num_splits <= (few_token_tiles ? kMaxMlaLongSplits : kMaxSplits) &&
           split_len_tokens >= 0 && d.num_heads <= 65535);
  const int lora = d.kv_lora_rank, qk = d.qk_nope_head_dim + d.qk_rope_head_dim;
  const int64_t q_token_stride = static_cast<int64_t>(d.num_heads) * qk;
  const int64_t latent_token_stride = static_cast<int64_t>(d.num_heads) * lora;
  // The cache write runs in the W_UK product's launch where that takes the few-token form with
  // a block for each token: a link fewer in the chain, since neither needs the other.
  CacheWriteBeside beside{d, b, {}, rope_cos, rope_sin};
  if (cache_write != nullptr) {
    const bool fits = takes_few_token_form(q_token_stride, w_uk, lora, q_latent, latent_token_stride, lora,
                                           b.num_tokens, fast_forms) &&
                      d.num_heads * few_form_slices(d.qk_nope_head_dim) >= b.num_tokens;
    if (fits) beside.job = *cache_write;
    else launch_mla_cache_write(d, b, *cache_write, rope_cos, rope_sin, stream);
  }
  const bool cache_just_written = beside.job.kv_a != nullptr;
  // q_lat[t, h] = q_nope[t, h] · W_UK[h]
  launch_head_gemm(q, q_token_stride, qk, w_uk, d.num_heads, d.qk_nope_head_dim, lora, q_latent, latent_token_stride,
                   lora, b.num_tokens, fast_forms, stream, nullptr, 0, beside, {}, weights_evict_first);
  const int64_t out_token_stride = static_cast<int64_t>(d.num_heads) * d.v_head_dim;
  SplitMergeBeside merge{d};  // the split path's merge, where it runs in the W_UV product's launch
  auto launch_combine = [&] {
    const dim3 grid(b.num_tokens, d.num_heads, (d.kv_lora_rank + kCombineCols - 1) / kCombineCols);
    launch_kernel(num_splits <= kMaxSplits ? attention_combine_kernel<kMaxSplits>
                                           : attention_combine_kernel<kMaxMlaLongSplits>,
                  grid, kCombineWarps * 32, 0, stream, d, num_splits, workspace, o_latent);
    DS_CUDA_CHECK_LAUNCH();
  };
  if (num_prefill_tiles > 0) {
    launch_mla_prefill_attention(d, b, q, q_latent, rope_cos, rope_sin, static_cast<const float*>(cache),
                                 softmax_scale, prefill_tiles, num_prefill_tiles, num_splits, workspace, o_latent,
                                 stream);
    if (num_splits > 1) launch_combine();
  } else if (head_tile_blocks > 0) {
    launch_mla_decode_head_tiles(d, b, q, q_latent, rope_cos, rope_sin, cache, softmax_scale, head_tile_blocks,
                                 work_starts, workspace, o_latent, stream);
  } else {
    // Partial results per (token, head, split), then merged: from head tiles of each token's
    // num_splits runs (few_token_tiles), or from the fp32 kernel, where DeepSeek's widths (512
    // latent, 64 rope columns) in 64-position blocks take the fixed forms.
    if (few_token_tiles) {
      launch_mla_decode_head_tiles_few_tokens(d, b, q, q_latent, rope_cos, rope_sin, cache, softmax_scale,
                                              num_splits, workspace, few_token_tiles_early, stream);
    } else {
      const bool fixed =
          fixed_split_forms && d.kv_lora_rank == 512 && d.qk_rope_head_dim == 64 && d.block_size == 64;
      DS_CHECK(split_group_positions == 1 || split_group_positions == 4);
      const bool grouped = split_group_positions == 4;
      const auto partial_kernel =
          !fixed        ? (grouped ? attention_partial_kernel<0, 0, 0, -1, 4>
                                   : attention_partial_kernel<0, 0, 0, -1, 1>)
          : d.cache_fp8 ? (grouped ? attention_partial_kernel<512, 64, 64, 1, 4>
                                   : attention_partial_kernel<512, 64, 64, 1, 1>)
                        : (grouped ? attention_partial_kernel<512, 64, 64, 0, 4>
                                   : attention_partial_kernel<512, 64, 64, 0, 1>);
      constexpr int kMaxGridY = 65535;
      for (int token_base = 0; token_base < b.num_tokens; token_base += kMaxGridY) {
        const dim3 grid(d.num_heads, std::min(kMaxGridY, b.num_tokens - token_base), num_splits);
        launch_kernel(partial_kernel, grid, kThreads, 0, stream, d, b, q, q_latent, rope_cos, rope_sin, cache,
                      softmax_scale, num_splits, split_len_tokens, token_base, workspace, cache_just_written);
        DS_CUDA_CHECK_LAUNCH();
      }
    }
    // The merge, in the W_UV product's launch where that takes the few-token form.
    if (b.num_tokens <= merge_beside_max_tokens && num_splits <= kMaxSplits &&
        takes_few_token_form(latent_token_stride, w_uv_t, d.v_head_dim, out, out_token_stride, d.v_head_dim,
                             b.num_tokens, fast_forms)) {
      merge.num_splits = num_splits;
      merge.workspace = workspace;
    } else {
      launch_combine();
    }
  }
  // out[t, h] = o_lat[t, h] · W_UVᵀ[h]
  return launch_head_gemm(o_latent, latent_token_stride, lora, w_uv_t, d.num_heads, lora, d.v_head_dim, out,
                          out_token_stride, d.v_head_dim, b.num_tokens, fast_forms, stream, out_bf16, ld_out_bf16,
                          {}, merge, weights_evict_first);
}

}  // namespace dsinfer::cuda
