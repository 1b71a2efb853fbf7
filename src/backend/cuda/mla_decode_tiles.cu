// Absorbed MLA decode in head tiles: a block takes up to 16 heads of a token, which share every
// read of the token's latent cache. The fp32 cache entries stream through two shared-memory
// stages (cp.async, 16 positions each; two blocks fit on an SM) while the eight warps compute on
// tensor cores in TF32, straight from the fp32 entries (their low mantissa bits ignored by the
// product):
// - scores [16 heads x 16 positions] = q_lat·c_kv + q_rope·k_rope over all 576 columns, the
//   columns split among the warps (each warp's slice of the queries stays in registers) and
//   the partial scores summed in shared memory;
// - an online softmax per head row (fp32);
// - out [16 x 512] += probs [16 x 16] · c_kv [16 x 512], each warp owning 64 columns of the
//   output in registers.
//
// Work is balanced across blocks whatever the mix of context lengths: the batch's work is the
// sequence of its tokens' 16-position chunks (each token also weighing kTokenCost chunks for
// its fixed costs), and block b of a head group takes the b-th of num_blocks equal ranges of
// that sequence. A block may so finish one token's context, take a few short tokens whole,
// and start the next; a long context is spread over many blocks. Each (token, block) segment
// leaves its unnormalised output, max and sum in a slot of the workspace, and the combine
// kernel merges a token's slots into o_lat. A plan kernel turns the step's positions into the
// work offsets on the device, so a recorded step replays for any lengths.
//
// An FP8 cache (latent_cache_format.h) streams its 656-byte entries through the same stages as
// raw bytes; once a chunk has arrived, the block widens it to fp32 in the chunk's stage (e4m3
// times its tile's scale, bf16 rope) while the next chunk loads, and computes as above.
#include <algorithm>
#include <cfloat>
#include <cstddef>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/latent_entry.cuh"
#include "backend/cuda/tensor_core.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = kMlaTileRows;  // heads of a tile
constexpr int kChunk = 16;           // positions per stage
constexpr int kStages = 2;  // with two stages a block fits twice per SM
constexpr int kMaxEntry = 576;  // kv_lora_rank + qk_rope_head_dim
constexpr int kMaxLora = 512;
constexpr int kMaxFp8Entry = 656;  // bytes of an FP8 entry of lora 512, rope 64
// Floats per cache row in shared memory: 8 past a multiple of 32. The scores' B fragments are
// then read as column pairs (a half-warp: 4 rows x 4 pairs) and the output's (4 rows x 8
// columns per load) from 32 distinct banks each.
constexpr int kLdEntry = kMaxEntry + 8;
constexpr int kLdScores = kChunk + 4;
// Registers per warp: k-steps of 8 columns of the scores, n-tiles of 8 output columns.
constexpr int kMaxKSteps = kMaxEntry / 8 / kWarps;  // 9
constexpr int kMaxOutTiles = kMaxLora / 8 / kWarps;  // 8
// A token's fixed costs (its queries, its partial result, the combine) in chunks of work.
constexpr int kTokenCost = 2;
// Blocks a head group's work may be cut into.
constexpr int kMaxBlocksPerGroup = 1024;
// Blocks per token above which the combine takes a token's slots four at a time.
constexpr int kManySlotsPerToken = 8;

struct Smem {
  float stage[kStages][kChunk][kLdEntry];  // the queries sit in the last stage before the loop
  float partial[kWarps][kRows][kLdScores];
  float probs[kRows][kLdScores];
  float row_max[kRows], row_sum[kRows], row_scale[kRows];
  // FP8 caches only (the launch for an fp32 cache leaves it out): the entries as they arrive.
  alignas(16) uint8_t raw[kStages][kChunk][kMaxFp8Entry];
};
static_assert(kRows <= kChunk, "the query rows fit in one stage");
// Shared memory of a launch: without the FP8 bytes for an fp32 cache.
constexpr size_t smem_bytes(bool fp8) { return fp8 ? sizeof(Smem) : offsetof(Smem, raw); }

// The cache slot of a chunk's first position. A chunk starts at a multiple of kChunk and the
// block size is a multiple of kChunk, so its positions are consecutive slots of one block.
__device__ __forceinline__ int64_t chunk_slot(const int32_t* table, int block_size, int p0) {
  return static_cast<int64_t>(table[p0 / block_size]) * block_size + p0 % block_size;
}

// Cache entries of the kChunk positions from `slot` into a stage; rows from num_valid on are
// zero. Warp w copies rows 2w and 2w + 1, each lane every 32nd 16-byte piece of a row, so
// every copy's addresses are a fixed offset from the row's: the trip count is fixed and the
// copies of a chunk are issued back to back, with little arithmetic between them.
__device__ __forceinline__ void load_chunk(float (*stage)[kLdEntry], const float* cache, int64_t slot, int entry,
                                           int num_valid) {
  static_assert(kChunk == 2 * kWarps, "a warp copies two rows of a chunk");
  constexpr int kPieces = kMaxEntry / 4;  // 16-byte pieces of the widest entry
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = 2 * warp + h;
    const bool valid = j < num_valid;
    const float* src = cache + (slot + (valid ? j : 0)) * entry + 4 * lane;
    float* dst = stage[j] + 4 * lane;
#pragma unroll
    for (int u = 0; u < (kPieces + 31) / 32; ++u)
      if (4 * (lane + 32 * u) < entry) cp_async16(dst + 128 * u, src + 128 * u, valid);
  }
}

// The FP8 entries of the kChunk positions from `slot`, as stored, into raw; rows from num_valid
// on are zero bytes, which widen to zeros.
__device__ __forceinline__ void load_chunk_fp8(uint8_t (*raw)[kMaxFp8Entry], const uint8_t* cache, int64_t slot,
                                               int entry_bytes, int num_valid) {
  constexpr int kVecs = kMaxFp8Entry / 16;
#pragma unroll
  for (int u = 0; u < (kChunk * kVecs + kThreads - 1) / kThreads; ++u) {
    const int i = threadIdx.x + u * kThreads, j = i / kVecs, c = i % kVecs * 16;
    if (i < kChunk * kVecs && c < entry_bytes) {
      const bool valid = j < num_valid;
      cp_async16(&raw[j][c], cache + (slot + (valid ? j : 0)) * entry_bytes + c, valid);
    }
  }
}

// A chunk of FP8 entries widened into fp32 rows [lora | rope] of its stage.
__device__ __forceinline__ void widen_chunk(float (*stage)[kLdEntry], const uint8_t (*raw)[kMaxFp8Entry],
                                            const MlaDims& d) {
  const int lora = d.kv_lora_rank, entry = lora + d.qk_rope_head_dim;
  for (int i = threadIdx.x; i < kChunk * entry; i += kThreads) {
    const int j = i / entry, c = i % entry;
    stage[j][c] = c < lora ? latent_value(d, raw[j], c) : rope_value(d, raw[j], c - lora);
  }
}

// A chunk's entries into its stage: fp32 straight in, FP8 into the raw bytes (widened later).
template <bool kFp8>
__device__ __forceinline__ void load_chunk_any(Smem& s, int stage, const MlaDims& d, const void* cache, int64_t slot,
                                               int num_valid) {
  if constexpr (kFp8)
    load_chunk_fp8(s.raw[stage], static_cast<const uint8_t*>(cache), slot, d.cache_entry_bytes, num_valid);
  else
    load_chunk(s.stage[stage], static_cast<const float*>(cache), slot, d.kv_lora_rank + d.qk_rope_head_dim, num_valid);
}

// The block of a head group whose range of the work holds offset x (ranges [⌊bW/B⌋, ⌊(b+1)W/B⌋)).
__device__ __forceinline__ int block_of(int64_t x, int64_t total_work, int num_blocks) {
  return static_cast<int>(((x + 1) * num_blocks - 1) / total_work);
}

// work_starts [T + 1]: token t's work begins at offset work_starts[t] (its fixed cost, then its
// chunks); work_starts[T] is the total. One block scans the tokens in tiles of its threads.
__global__ void __launch_bounds__(1024) plan_kernel(MlaBatchView b, int32_t* work_starts) {
  await_previous_kernels();
  __shared__ int32_t tile_sums[1024];
  int32_t base = 0;
  for (int t0 = 0; t0 < b.num_tokens; t0 += blockDim.x) {
    const int t = t0 + threadIdx.x;
    const int32_t w = t < b.num_tokens ? kTokenCost + (b.positions[t] + 1 + kChunk - 1) / kChunk : 0;
    tile_sums[threadIdx.x] = w;
    __syncthreads();
    for (int off = 1; off < static_cast<int>(blockDim.x); off <<= 1) {  // inclusive scan
      const int32_t v = threadIdx.x >= static_cast<unsigned>(off) ? tile_sums[threadIdx.x - off] : 0;
      __syncthreads();
      tile_sums[threadIdx.x] += v;
      __syncthreads();
    }
    if (t < b.num_tokens) work_starts[t] = base + tile_sums[threadIdx.x] - w;
    base += tile_sums[blockDim.x - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) work_starts[b.num_tokens] = base;
}

// The tile's rows (heads h0 .. h0 + count - 1 of token t) attend over cache positions
// [begin, end) of the token's sequence; the unnormalised output, max and sum of row r go to
// part + r * row_stride (lora + 2 floats each). Ends with the block synchronised: the shared
// memory may be reused.
template <bool kFp8>
__device__ void attend_segment(Smem& s, const MlaDims& d, const MlaBatchView& b, const float* q,
                               const float* q_latent, const float* rope_cos, const float* rope_sin, const void* cache,
                               float softmax_scale, int t, int h0, int count, int begin, int end, float* part,
                               int64_t row_stride, bool first_chunk_issued = false) {
  const int lora = d.kv_lora_rank, rope = d.qk_rope_head_dim, entry = lora + rope;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int32_t* table = b.tables + b.table_offsets[b.token_seq[t]];
  const int num_chunks = (end - begin + kChunk - 1) / kChunk;
  auto load_first = [&](int c) {
    const int p0 = begin + c * kChunk;
    load_chunk_any<kFp8>(s, c, d, cache, chunk_slot(table, d.block_size, p0), end - p0);
  };
  // (first_chunk_issued: the caller issued and committed chunk 0's copies before its wait.)
  if (!first_chunk_issued) start_cp_async_pipeline<kStages>(load_first, num_chunks);
  // The slot of the chunk loaded next, read one iteration ahead so that the table's latency is
  // off the loop's path.
  int64_t next_slot = kStages - 1 < num_chunks ? chunk_slot(table, d.block_size, begin + (kStages - 1) * kChunk) : 0;

  // The tile's queries, q_lat | rotated q_rope (rows past count zero), in the last stage. A
  // thread issues all of its loads before its first store: a loop that stored each value as it
  // arrived waited for one trip to L2 after another, 36 a thread, which at batch 1 cost more than
  // the block's whole share of the cache.
  float (*q_s)[kLdEntry] = s.stage[kStages - 1];
  const int nope = d.qk_nope_head_dim, half = rope / 2, pos = b.positions[t];
  {
    constexpr int kLatentPieces = kRows * kMaxLora / 4 / kThreads;  // float4 a thread
    constexpr int kRopeValues = kRows * (kMaxEntry - kMaxLora) / kThreads;
    const int lora4 = lora / 4;  // lora is a multiple of 16
    const int64_t th0 = static_cast<int64_t>(t) * d.num_heads + h0;
    float4 lat[kLatentPieces];
#pragma unroll
    for (int u = 0; u < kLatentPieces; ++u) {
      const int i = threadIdx.x + u * kThreads, r = i / lora4, c4 = i - r * lora4;
      lat[u] = r < count ? *reinterpret_cast<const float4*>(q_latent + (th0 + r) * lora + 4 * c4)
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float rot[kRopeValues];
#pragma unroll
    for (int u = 0; u < kRopeValues; ++u) {
      const int i = threadIdx.x + u * kThreads, r = rope > 0 ? i / rope : kRows, c = i - r * rope;
      rot[u] = 0.0f;
      if (r < count) {
        const int j = c / 2;
        const float* qr = q + (th0 + r) * (nope + rope) + nope;
        const float cs = rope_cos[pos * half + j], sn = rope_sin[pos * half + j];
        rot[u] = c % 2 == 0 ? qr[2 * j] * cs - qr[2 * j + 1] * sn : qr[2 * j] * sn + qr[2 * j + 1] * cs;
      }
    }
#pragma unroll
    for (int u = 0; u < kLatentPieces; ++u) {
      const int i = threadIdx.x + u * kThreads, r = i / lora4, c4 = i - r * lora4;
      if (r < kRows) *reinterpret_cast<float4*>(&q_s[r][4 * c4]) = lat[u];
    }
#pragma unroll
    for (int u = 0; u < kRopeValues; ++u) {
      const int i = threadIdx.x + u * kThreads, r = rope > 0 ? i / rope : kRows, c = i - r * rope;
      if (r < kRows) q_s[r][lora + c] = rot[u];
    }
  }
  if (threadIdx.x < kRows) {
    s.row_max[threadIdx.x] = -FLT_MAX;
    s.row_sum[threadIdx.x] = 0.0f;
  }
  __syncthreads();
  // Warp w's k-steps of the scores are w, w + 8, ...: their query fragments in registers. A
  // k-step's columns are taken in the order 0, 2, 4, 6, 1, 3, 5, 7 (the product's k slots tq and
  // tq + 4 are columns 2 tq and 2 tq + 1), the same for queries and cache: a dot product in
  // any order of its terms, so that a lane reads its two cache columns in one 8-byte load.
  uint32_t q_frag[kMaxKSteps][4];
#pragma unroll
  for (int i = 0; i < kMaxKSteps; ++i) {
    const int k0 = (warp + i * kWarps) * 8;
    if (k0 < entry) {
      q_frag[i][0] = to_tf32(q_s[g][k0 + 2 * tq]);
      q_frag[i][1] = to_tf32(q_s[g + 8][k0 + 2 * tq]);
      q_frag[i][2] = to_tf32(q_s[g][k0 + 2 * tq + 1]);
      q_frag[i][3] = to_tf32(q_s[g + 8][k0 + 2 * tq + 1]);
    }
  }
  // Warp w's output columns: n-tiles w, w + 8, ... of lora / 8.
  float o[kMaxOutTiles][4];
#pragma unroll
  for (int i = 0; i < kMaxOutTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  __syncthreads();  // the queries are read: the last stage may be loaded

  for (int ch = 0; ch < num_chunks; ++ch) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk ch is in place; every warp is done with chunk ch - 1
    {
      const int next = ch + kStages - 1;
      if (next < num_chunks) load_chunk_any<kFp8>(s, next % kStages, d, cache, next_slot, end - begin - next * kChunk);
      cp_async_commit();
      if (next + 1 < num_chunks) next_slot = chunk_slot(table, d.block_size, begin + (next + 1) * kChunk);
    }
    if constexpr (kFp8) {
      // Chunk ch's bytes are in; its stage was last read for chunk ch - kStages.
      widen_chunk(s.stage[ch % kStages], s.raw[ch % kStages], d);
      __syncthreads();
    }
    const float (*kv)[kLdEntry] = s.stage[ch % kStages];
    const int p0 = begin + ch * kChunk;

    // Partial scores of this warp's columns: n-tile n holds positions p0 + 8n .. p0 + 8n + 7.
    float acc[kChunk / 8][4] = {};
#pragma unroll
    for (int i = 0; i < kMaxKSteps; ++i) {
      const int k0 = (warp + i * kWarps) * 8;
      if (k0 < entry) {
#pragma unroll
        for (int n = 0; n < kChunk / 8; ++n) {
          const float2 kk = *reinterpret_cast<const float2*>(&kv[n * 8 + g][k0 + 2 * tq]);
          mma_tf32_16x8x8(acc[n], q_frag[i], __float_as_uint(kk.x), __float_as_uint(kk.y));
        }
      }
    }
#pragma unroll
    for (int n = 0; n < kChunk / 8; ++n) {
      s.partial[warp][g][n * 8 + 2 * tq] = acc[n][0];
      s.partial[warp][g][n * 8 + 2 * tq + 1] = acc[n][1];
      s.partial[warp][g + 8][n * 8 + 2 * tq] = acc[n][2];
      s.partial[warp][g + 8][n * 8 + 2 * tq + 1] = acc[n][3];
    }
    __syncthreads();

    // Online softmax: thread i takes row i / 16, position i % 16 (a row is half a warp).
    {
      const int r = threadIdx.x / kChunk, c = threadIdx.x % kChunk;
      float score = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) score += s.partial[w][r][c];
      const bool visible = p0 + c < end;
      score = visible ? score * softmax_scale : -FLT_MAX;
      float m = score;
      for (int off = kChunk / 2; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      const float m_old = s.row_max[r], m_new = fmaxf(m_old, m);
      const float p = visible ? expf(score - m_new) : 0.0f;
      s.probs[r][c] = p;
      float sum = p;
      for (int off = kChunk / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      __syncwarp();  // every lane of the row has read row_max before it changes
      if (c == 0) s.row_scale[r] = advance_softmax_row(s.row_max[r], s.row_sum[r], m_new, sum);
    }
    __syncthreads();

    // out += probs · c_kv over this warp's columns.
    const float scale_lo = s.row_scale[g], scale_hi = s.row_scale[g + 8];
    uint32_t a[kChunk / 8][4];
#pragma unroll
    for (int ks = 0; ks < kChunk / 8; ++ks) {
      a[ks][0] = to_tf32(s.probs[g][ks * 8 + tq]);
      a[ks][1] = to_tf32(s.probs[g + 8][ks * 8 + tq]);
      a[ks][2] = to_tf32(s.probs[g][ks * 8 + tq + 4]);
      a[ks][3] = to_tf32(s.probs[g + 8][ks * 8 + tq + 4]);
    }
#pragma unroll
    for (int i = 0; i < kMaxOutTiles; ++i) {
      const int n0 = (warp + i * kWarps) * 8;
      if (n0 < lora) {
        o[i][0] *= scale_lo;
        o[i][1] *= scale_lo;
        o[i][2] *= scale_hi;
        o[i][3] *= scale_hi;
#pragma unroll
        for (int ks = 0; ks < kChunk / 8; ++ks)
          mma_tf32_16x8x8(o[i], a[ks], __float_as_uint(kv[ks * 8 + tq][n0 + g]),
                          __float_as_uint(kv[ks * 8 + tq + 4][n0 + g]));
      }
    }
  }

  // Rows g and g + 8 of this warp's columns, then each row's max and sum.
#pragma unroll
  for (int i = 0; i < kMaxOutTiles; ++i) {
    const int n0 = (warp + i * kWarps) * 8;
    if (n0 >= lora) continue;
    for (int hi = 0; hi < 2; ++hi) {
      const int r = g + hi * 8;
      if (r < count)
        *reinterpret_cast<float2*>(part + r * row_stride + n0 + 2 * tq) =
            make_float2(o[i][2 * hi], o[i][2 * hi + 1]);
    }
  }
  if (threadIdx.x < count) {
    part[threadIdx.x * row_stride + lora] = s.row_max[threadIdx.x];
    part[threadIdx.x * row_stride + lora + 1] = s.row_sum[threadIdx.x];
  }
  __syncthreads();
}

// Block (head group, b): the b-th of num_blocks equal ranges of the batch's work; kFp8: the
// cache holds FP8 entries.
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 2) decode_tiles_kernel(MlaDims d, MlaBatchView b, const float* q,
                                                                const float* q_latent, const float* rope_cos,
                                                                const float* rope_sin, const void* cache,
                                                                float softmax_scale, int num_blocks,
                                                                const int32_t* work_starts, float* workspace) {
  await_previous_kernels();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  const int h0 = blockIdx.x * kRows, blk = blockIdx.y;
  const int count = min(kRows, d.num_heads - h0), lora = d.kv_lora_rank;
  const int64_t total = work_starts[b.num_tokens];
  const int64_t start = blk * total / num_blocks, stop = (blk + 1) * total / num_blocks;
  if (start >= stop) return;
  // The first token whose work reaches past `start`: the last t with work_starts[t] <= start.
  int lo = 0, hi = b.num_tokens - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (work_starts[mid] <= start) lo = mid; else hi = mid - 1;
  }
  for (int t = lo; t < b.num_tokens && work_starts[t] < stop; ++t) {
    const int64_t first_chunk = work_starts[t] + kTokenCost;  // the offset of the token's first chunk
    const int num_ctx = b.positions[t] + 1, num_chunks = (num_ctx + kChunk - 1) / kChunk;
    const int64_t c_lo = max(start, first_chunk) - first_chunk;
    const int64_t c_hi = min(stop, first_chunk + num_chunks) - first_chunk;
    if (c_lo >= c_hi) continue;  // this block holds only the token's fixed cost
    // Slot blk + t is this segment's: the blocks of token t are consecutive and later tokens
    // start at its last block or after, so slots never collide.
    float* part = workspace + ((static_cast<int64_t>(blk) + t) * d.num_heads + h0) * (lora + 2);
    attend_segment<kFp8>(s, d, b, q, q_latent, rope_cos, rope_sin, cache, softmax_scale, t, h0, count,
                   static_cast<int>(c_lo) * kChunk, min(static_cast<int>(c_hi) * kChunk, num_ctx), part, lora + 2);
  }
}

// A step of few tokens: block (head group, b, t) takes the b-th of num_blocks equal runs of
// token t's context chunks, without a plan (the run follows from the token's position), and
// leaves its rows' partial results where the split kernel leaves split b's (workspace [T, H,
// num_blocks, lora + 2]), for that kernel's combine, which loads all of a head's slots at once. A
// block without chunks leaves a sum of zero, which the combine skips. Why not the planned form
// at a few tokens: it adds the plan's launch to the chain, cuts a token's 64 chunks (1k
// positions) over 264 blocks or so, each staging all 16 heads' queries for a fraction of a
// chunk, and its combine walks each head's many pieces in one warp.
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 2)
    decode_tiles_few_tokens_kernel(MlaDims d, MlaBatchView b, const float* q, const float* q_latent,
                                   const float* rope_cos, const float* rope_sin, const void* cache,
                                   float softmax_scale, int num_blocks, float* workspace, bool early_first_chunk) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  const int h0 = blockIdx.x * kRows, blk = blockIdx.y, t = blockIdx.z;
  const int count = min(kRows, d.num_heads - h0), lora = d.kv_lora_rank;
  // The step's positions and block tables, and cache entries older than the step's own (which
  // the launch just before writes), may be read before the wait (kernel_launch.cuh). A token
  // reads new entries only of its own sequence, at most T - 1 positions before its own: the
  // first chunk's copies are issued here where the chunk ends before those.
  const int num_ctx = b.positions[t] + 1, num_chunks = (num_ctx + kChunk - 1) / kChunk;
  const int c_lo = static_cast<int>(int64_t{blk} * num_chunks / num_blocks);
  const int c_hi = static_cast<int>(int64_t{blk + 1} * num_chunks / num_blocks);
  const bool early = early_first_chunk && c_lo < c_hi && (c_lo + 1) * kChunk <= num_ctx - b.num_tokens;
  if (early) {
    const int32_t* table = b.tables + b.table_offsets[b.token_seq[t]];
    const int p0 = c_lo * kChunk;
    load_chunk_any<kFp8>(s, 0, d, cache, chunk_slot(table, d.block_size, p0), num_ctx - p0);
    cp_async_commit();
  }
  await_previous_kernels();
  const int64_t row_stride = int64_t{num_blocks} * (lora + 2);
  float* part = workspace + ((static_cast<int64_t>(t) * d.num_heads + h0) * num_blocks + blk) * (lora + 2);
  if (c_lo >= c_hi) {
    if (threadIdx.x < count) {
      part[threadIdx.x * row_stride + lora] = -FLT_MAX;
      part[threadIdx.x * row_stride + lora + 1] = 0.0f;
    }
    return;
  }
  attend_segment<kFp8>(s, d, b, q, q_latent, rope_cos, rope_sin, cache, softmax_scale, t, h0, count, c_lo * kChunk,
                       min(c_hi * kChunk, num_ctx), part, row_stride, early);
}

// One warp per (token, head), kWarps of them per block: merges the token's slots, one per block
// that held some of its chunks (each saw at least one position), into the normalised o_lat
// [T, H, lora]. A warp needs no barrier: its lanes take the slots' maxima and sums, then two
// columns of every 64 each, over all the slots in order, kUnroll slots' loads issued together.
template <int kUnroll>
__global__ void __launch_bounds__(kThreads) combine_kernel(MlaDims d, int num_tokens, int num_blocks,
                                                           const int32_t* work_starts, const float* workspace,
                                                           float* o_latent) {
  await_previous_kernels();
  constexpr int kColPairs = kMaxLora / 64;  // a lane's column pairs
  const int lane = threadIdx.x % 32;
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (pair >= static_cast<int64_t>(num_tokens) * d.num_heads) return;
  const int t = static_cast<int>(pair / d.num_heads), h = static_cast<int>(pair % d.num_heads);
  const int lora = d.kv_lora_rank;
  const int64_t total = work_starts[num_tokens];
  const int64_t first_chunk = work_starts[t] + kTokenCost;
  const int num_chunks = work_starts[t + 1] - work_starts[t] - kTokenCost;
  const int first = block_of(first_chunk, total, num_blocks);
  const int num_parts = block_of(first_chunk + num_chunks - 1, total, num_blocks) - first + 1;
  const int64_t stride = static_cast<int64_t>(d.num_heads) * (lora + 2);
  const float* parts = workspace + ((static_cast<int64_t>(first) + t) * d.num_heads + h) * (lora + 2);
  // With less work than blocks, some blocks' ranges are empty, also between two that hold this
  // token's chunks: such a block wrote no slot, and what its slot holds is left from earlier.
  auto holds_work = [&](int i) {
    const int64_t blk = first + i;
    return blk * total / num_blocks < (blk + 1) * total / num_blocks;
  };
  float m = -FLT_MAX;
  for (int i = lane; i < num_parts; i += 32)
    if (holds_work(i)) m = fmaxf(m, parts[i * stride + lora]);
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  float denom = 0.0f;
  for (int i = lane; i < num_parts; i += 32)
    if (holds_work(i)) denom += parts[i * stride + lora + 1] * expf(parts[i * stride + lora] - m);
  for (int off = 16; off > 0; off >>= 1) denom += __shfl_xor_sync(0xffffffffu, denom, off);
  float2 v[kColPairs];
#pragma unroll
  for (int j = 0; j < kColPairs; ++j) v[j] = make_float2(0.0f, 0.0f);
  // A slot of a block without work is read too (it lies within the workspace) and then
  // ignored, since what it holds may be anything.
  for (int i0 = 0; i0 < num_parts; i0 += kUnroll) {
    float weight[kUnroll];
    float2 p[kUnroll][kColPairs];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = min(i0 + u, num_parts - 1);
      const float* part = parts + i * stride;
      weight[u] = i0 + u < num_parts && holds_work(i) ? expf(part[lora] - m) : 0.0f;
#pragma unroll
      for (int j = 0; j < kColPairs; ++j) {
        const int c = 64 * j + 2 * lane;
        p[u][j] = c < lora ? *reinterpret_cast<const float2*>(part + c) : make_float2(0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (weight[u] == 0.0f) continue;
#pragma unroll
      for (int j = 0; j < kColPairs; ++j) {
        v[j].x += p[u][j].x * weight[u];
        v[j].y += p[u][j].y * weight[u];
      }
    }
  }
  const float inv = 1.0f / denom;
  float* dst = o_latent + (static_cast<int64_t>(t) * d.num_heads + h) * lora;
#pragma unroll
  for (int j = 0; j < kColPairs; ++j) {
    const int c = 64 * j + 2 * lane;
    if (c < lora) *reinterpret_cast<float2*>(dst + c) = make_float2(v[j].x * inv, v[j].y * inv);
  }
}

}  // namespace

bool mla_head_tiles_supported(const MlaDims& d) {
  return mla_tile_shapes_supported(d) && d.kv_lora_rank <= kMaxLora && d.qk_rope_head_dim <= kMaxEntry - kMaxLora &&
         d.block_size % kChunk == 0 &&
         (!d.cache_fp8 || d.cache_entry_bytes <= kMaxFp8Entry);
}

namespace {
// Blocks of the decode-tile kernel for this cache format that fit on an SM.
template <bool kFp8>
int decode_tile_blocks_per_sm() {
  static const int per_sm = [] {
    allow_shared_bytes<decode_tiles_kernel<kFp8>>(smem_bytes(kFp8));
    int n = 0;
    DS_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_tiles_kernel<kFp8>, kThreads, smem_bytes(kFp8)));
    return n;
  }();
  return per_sm;
}
}  // namespace

int mla_head_tile_blocks(const MlaDims& d, int num_sms) {
  const int per_sm = d.cache_fp8 ? decode_tile_blocks_per_sm<true>() : decode_tile_blocks_per_sm<false>();
  const int groups = (d.num_heads + kRows - 1) / kRows;
  return std::clamp(num_sms * std::max(per_sm, 1) / groups, 1, kMaxBlocksPerGroup);
}

void launch_mla_decode_head_tiles(const MlaDims& d, const MlaBatchView& b, const float* q, const float* q_latent,
                                  const float* rope_cos, const float* rope_sin, const void* cache,
                                  float softmax_scale, int num_blocks, int32_t* work_starts, float* workspace,
                                  float* o_latent, Stream stream) {
  DS_CHECK(mla_head_tiles_supported(d) && num_blocks >= 1 && num_blocks <= kMaxBlocksPerGroup &&
           d.num_heads <= 65535);
  if (b.num_tokens == 0) return;
  allow_shared_bytes<decode_tiles_kernel<false>>(smem_bytes(false));
  allow_shared_bytes<decode_tiles_kernel<true>>(smem_bytes(true));
  launch_kernel(plan_kernel, 1, 1024, 0, stream, b, work_starts);
  DS_CUDA_CHECK_LAUNCH();
  const dim3 grid((d.num_heads + kRows - 1) / kRows, num_blocks);
  launch_kernel(d.cache_fp8 ? decode_tiles_kernel<true> : decode_tiles_kernel<false>, grid, kThreads,
                smem_bytes(d.cache_fp8),
                stream, d, b, q, q_latent, rope_cos, rope_sin, cache,
                softmax_scale, num_blocks, work_starts, workspace);
  DS_CUDA_CHECK_LAUNCH();
  const int64_t num_pairs = static_cast<int64_t>(b.num_tokens) * d.num_heads;
  const unsigned combine_blocks = static_cast<unsigned>((num_pairs + kWarps - 1) / kWarps);
  // Where tokens span many blocks each (small batches), a warp's slots are a long chain of
  // loads: four slots at a time. One at a time otherwise: on the H200 the unrolled form made
  // FP8 decode at batch 64 4% slower, and the plain one batch 16 3% slower.
  const bool many_slots = num_blocks > kManySlotsPerToken * b.num_tokens;
  launch_kernel(many_slots ? combine_kernel<4> : combine_kernel<1>, combine_blocks, kThreads, 0, stream, d,
                b.num_tokens, num_blocks, work_starts, workspace, o_latent);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_mla_decode_head_tiles_few_tokens(const MlaDims& d, const MlaBatchView& b, const float* q,
                                             const float* q_latent, const float* rope_cos, const float* rope_sin,
                                             const void* cache, float softmax_scale, int num_blocks,
                                             float* workspace, bool early_first_chunk, Stream stream) {
  DS_CHECK(mla_head_tiles_supported(d) && num_blocks >= 1 && num_blocks <= 65535 && d.num_heads <= 65535 &&
           b.num_tokens <= 65535);
  if (b.num_tokens == 0) return;
  allow_shared_bytes<decode_tiles_few_tokens_kernel<false>>(smem_bytes(false));
  allow_shared_bytes<decode_tiles_few_tokens_kernel<true>>(smem_bytes(true));
  const dim3 grid((d.num_heads + kRows - 1) / kRows, num_blocks, b.num_tokens);
  launch_kernel(d.cache_fp8 ? decode_tiles_few_tokens_kernel<true> : decode_tiles_few_tokens_kernel<false>, grid,
                kThreads, smem_bytes(d.cache_fp8), stream, d, b, q, q_latent, rope_cos, rope_sin, cache,
                softmax_scale, num_blocks, workspace, early_first_chunk);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
