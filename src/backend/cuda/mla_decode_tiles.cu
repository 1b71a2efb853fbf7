// Absorbed MLA decode in head tiles: a block takes up to 16 heads of one token, which share
// every read of the token's latent cache, over one split of its context. The fp32 cache
// entries stream through three shared-memory stages (cp.async, 16 positions each) while the
// eight warps compute on tensor cores in TF32, straight from the fp32 entries:
// - scores [16 heads x 16 positions] = q_lat·c_kv + q_rope·k_rope over all 576 columns, the
//   columns split among the warps (each warp's slice of the queries stays in registers) and
//   the partial scores summed in shared memory;
// - an online softmax per head row (fp32);
// - out [16 x 512] += probs [16 x 16] · c_kv [16 x 512], each warp owning 64 columns of the
//   output in registers.
// Each (token, head, split) leaves its unnormalised output, max and sum for the combine kernel
// of cuda_attention.cu; the caller projects the combined o_lat through W_UV.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/tensor_core.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = kMlaTileRows;  // heads of a tile
constexpr int kChunk = 16;           // positions per stage
constexpr int kStages = 3;
constexpr int kMaxEntry = 576;  // kv_lora_rank + qk_rope_head_dim
constexpr int kMaxLora = 512;
// Floats per cache row in shared memory: 4 past a multiple of 32, so the B fragments of the
// scores (8 rows x 4 columns per load) hit 32 distinct banks.
constexpr int kLdEntry = kMaxEntry + 4;
constexpr int kLdScores = kChunk + 4;
// Registers per warp: k-steps of 8 columns of the scores, n-tiles of 8 output columns.
constexpr int kMaxKSteps = kMaxEntry / 8 / kWarps;  // 9
constexpr int kMaxOutTiles = kMaxLora / 8 / kWarps;  // 8
// Splits hold at least this many positions: a short context uses fewer splits and the rest of
// its blocks exit at once.
constexpr int kMinSplitPositions = 64;

struct Smem {
  float stage[kStages][kChunk][kLdEntry];  // the queries sit in the last stage before the loop
  float partial[kWarps][kRows][kLdScores];
  float probs[kRows][kLdScores];
  float row_max[kRows], row_sum[kRows], row_scale[kRows];
};
static_assert(kRows <= kChunk, "the query rows fit in one stage");

// The cache slot of a chunk's first position. A chunk starts at a multiple of kChunk and the
// block size is a multiple of kChunk, so its positions are consecutive slots of one block.
__device__ __forceinline__ int64_t chunk_slot(const int32_t* table, int block_size, int p0) {
  return static_cast<int64_t>(table[p0 / block_size]) * block_size + p0 % block_size;
}

// Cache entries of the kChunk positions from `slot` into a stage; rows from num_valid on are
// zero. The trip count is fixed, so every copy of the chunk is issued back to back.
__device__ __forceinline__ void load_chunk(float (*stage)[kLdEntry], const float* cache, int64_t slot, int entry,
                                           int num_valid) {
  constexpr int kVecs = kMaxEntry / 4;
#pragma unroll
  for (int u = 0; u < (kChunk * kVecs + kThreads - 1) / kThreads; ++u) {
    const int i = threadIdx.x + u * kThreads, j = i / kVecs, c = i % kVecs * 4;
    if (i < kChunk * kVecs && c < entry) {
      const bool valid = j < num_valid;
      cp_async16(&stage[j][c], cache + (slot + (valid ? j : 0)) * entry + c, valid);
    }
  }
}

// Block (head group, token_base + y, split). With split_len 0 a token cuts its context into
// whole chunks over at most num_splits splits of kMinSplitPositions or more.
__global__ void __launch_bounds__(kThreads) decode_tiles_kernel(MlaDims d, MlaBatchView b, const float* q,
                                                                const float* q_latent, const float* rope_cos,
                                                                const float* rope_sin, const float* cache,
                                                                float softmax_scale, int num_splits, int split_len,
                                                                int token_base, float* workspace) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  const int h0 = blockIdx.x * kRows, t = token_base + blockIdx.y, split = blockIdx.z;
  const int count = min(kRows, d.num_heads - h0), lora = d.kv_lora_rank, rope = d.qk_rope_head_dim;
  const int entry = lora + rope;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int num_ctx = b.positions[t] + 1;
  if (split_len == 0) {
    const int used = min(num_splits, (num_ctx + kMinSplitPositions - 1) / kMinSplitPositions);
    split_len = (num_ctx + kChunk * used - 1) / (kChunk * used) * kChunk;
  }
  const int begin = split * split_len, end = min(begin + split_len, num_ctx);
  float* parts = workspace + (static_cast<int64_t>(t) * d.num_heads + h0) * num_splits * (lora + 2);
  if (begin >= end) {  // an unused split: sum 0, which the combine skips
    if (threadIdx.x < count) parts[(static_cast<int64_t>(threadIdx.x) * num_splits + split) * (lora + 2) + lora + 1] = 0.0f;
    return;
  }
  const int32_t* table = b.tables + b.table_offsets[b.token_seq[t]];
  const int num_chunks = (end - begin + kChunk - 1) / kChunk;
  for (int c = 0; c < kStages - 1; ++c) {
    const int p0 = begin + c * kChunk;
    if (c < num_chunks) load_chunk(s.stage[c], cache, chunk_slot(table, d.block_size, p0), entry, end - p0);
    cp_async_commit();
  }
  // The slot of the chunk loaded next, read one iteration ahead so that the table's latency is
  // off the loop's path.
  int64_t next_slot = kStages - 1 < num_chunks ? chunk_slot(table, d.block_size, begin + (kStages - 1) * kChunk) : 0;

  // The tile's queries, q_lat | rotated q_rope (rows past count zero), in the last stage.
  float (*q_s)[kLdEntry] = s.stage[kStages - 1];
  const int nope = d.qk_nope_head_dim, half = rope / 2, pos = b.positions[t];
  for (int i = threadIdx.x; i < kRows * entry; i += kThreads) {
    const int r = i / entry, c = i % entry;
    float v = 0.0f;
    if (r < count) {
      const int64_t th = static_cast<int64_t>(t) * d.num_heads + h0 + r;
      if (c < lora) {
        v = q_latent[th * lora + c];
      } else {
        const int j = (c - lora) / 2;
        const float* qr = q + th * (nope + rope) + nope;
        const float cs = rope_cos[pos * half + j], sn = rope_sin[pos * half + j];
        v = (c - lora) % 2 == 0 ? qr[2 * j] * cs - qr[2 * j + 1] * sn : qr[2 * j] * sn + qr[2 * j + 1] * cs;
      }
    }
    q_s[r][c] = v;
  }
  if (threadIdx.x < kRows) {
    s.row_max[threadIdx.x] = -FLT_MAX;
    s.row_sum[threadIdx.x] = 0.0f;
  }
  __syncthreads();
  // Warp w's k-steps of the scores are w, w + 8, ...: their query fragments in registers.
  uint32_t q_frag[kMaxKSteps][4];
#pragma unroll
  for (int i = 0; i < kMaxKSteps; ++i) {
    const int k0 = (warp + i * kWarps) * 8;
    if (k0 < entry) {
      q_frag[i][0] = to_tf32(q_s[g][k0 + tq]);
      q_frag[i][1] = to_tf32(q_s[g + 8][k0 + tq]);
      q_frag[i][2] = to_tf32(q_s[g][k0 + tq + 4]);
      q_frag[i][3] = to_tf32(q_s[g + 8][k0 + tq + 4]);
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
      if (next < num_chunks) load_chunk(s.stage[next % kStages], cache, next_slot, entry, end - begin - next * kChunk);
      cp_async_commit();
      if (next + 1 < num_chunks) next_slot = chunk_slot(table, d.block_size, begin + (next + 1) * kChunk);
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
        for (int n = 0; n < kChunk / 8; ++n)
          mma_tf32_16x8x8(acc[n], q_frag[i], to_tf32(kv[n * 8 + g][k0 + tq]), to_tf32(kv[n * 8 + g][k0 + tq + 4]));
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
          mma_tf32_16x8x8(o[i], a[ks], to_tf32(kv[ks * 8 + tq][n0 + g]), to_tf32(kv[ks * 8 + tq + 4][n0 + g]));
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
        *reinterpret_cast<float2*>(parts + (static_cast<int64_t>(r) * num_splits + split) * (lora + 2) + n0 + 2 * tq) =
            make_float2(o[i][2 * hi], o[i][2 * hi + 1]);
    }
  }
  if (threadIdx.x < count) {
    float* row = parts + (static_cast<int64_t>(threadIdx.x) * num_splits + split) * (lora + 2);
    row[lora] = s.row_max[threadIdx.x];
    row[lora + 1] = s.row_sum[threadIdx.x];
  }
}

}  // namespace

bool mla_head_tiles_supported(const MlaDims& d) {
  return mla_tiles_supported(d) && d.kv_lora_rank <= kMaxLora && d.kv_lora_rank + d.qk_rope_head_dim <= kMaxEntry &&
         d.block_size % kChunk == 0;
}

void launch_mla_decode_head_tiles(const MlaDims& d, const MlaBatchView& b, const float* q, const float* q_latent,
                                  const float* rope_cos, const float* rope_sin, const float* cache,
                                  float softmax_scale, int num_splits, int split_len_tokens, float* workspace,
                                  Stream stream) {
  DS_CHECK(mla_head_tiles_supported(d) && (split_len_tokens % kChunk == 0));
  if (b.num_tokens == 0) return;
  static const bool configured = [] {
    DS_CUDA_CHECK(cudaFuncSetAttribute(decode_tiles_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(sizeof(Smem))));
    return true;
  }();
  (void)configured;
  constexpr int kMaxGridY = 65535;
  const int groups = (d.num_heads + kRows - 1) / kRows;
  for (int token_base = 0; token_base < b.num_tokens; token_base += kMaxGridY) {
    const dim3 grid(groups, std::min(kMaxGridY, b.num_tokens - token_base), num_splits);
    decode_tiles_kernel<<<grid, kThreads, sizeof(Smem), stream>>>(d, b, q, q_latent, rope_cos, rope_sin, cache,
                                                                  softmax_scale, num_splits, split_len_tokens,
                                                                  token_base, workspace);
    DS_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace dsinfer::cuda
