// MLA attention on the CPU, always in the weight-absorbed form over the paged latent cache:
// the cache holds per token the normalised c_kv (kv_lora_rank) and the rotated k_rope
// (rope_dim), and every head attends to it as one shared key/value (MQA in latent space).
// An FP8 cache (latent_cache_format.h) is quantised as tokens are written and dequantised as
// they are read; attention itself is the same.
//
// Where CpuRoundings::bf16_expanded_attention asks, a sequence's prefill chunk of 16 tokens or
// more attends as the CUDA backend's expanded form does, with its bf16 operands: the context's
// latent entries rounded to bf16 and up-projected per head into keys and values (bf16 weights,
// fp32 sums, bf16 results), bf16 queries, and unnormalised probabilities rounded to bf16 for
// the product with the values. Where CpuRoundings::bf16_query_tiles asks, the other tokens of a
// step with a sequence of 16 of them or more attend as the CUDA backend's query tiles do
// (mla_tensor_core.cu): bf16 queries and entries, an online softmax over chunks of 32 positions,
// bf16 probabilities. Where CpuRoundings::tf32_head_tiles asks, steps the CUDA backend gives its
// head tiles (4 to 8 tokens, or 16 and more without such a sequence; mla_decode_tiles.cu) attend
// with TF32 queries and probabilities and the entries' low mantissa bits ignored, over chunks of
// 16 positions. The same attention, rounded where the CUDA kernels round.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_matmul.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace dsinfer {
namespace {

// Interleaved pairs (x0,x1),(x2,x3)…: complex multiplication by e^{i·pos·freq}.
void rotate_interleaved(float* x, int rope_dim, const float* cos, const float* sin) {
  for (int i = 0; i < rope_dim / 2; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * cos[i] - b * sin[i];
    x[2 * i + 1] = a * sin[i] + b * cos[i];
  }
}

// A sequence with this many new tokens in a step attends in the CUDA backend's expanded form.
constexpr int kExpandedMinTokens = 16;
// A step with a sequence of this many other new tokens attends in its query tiles.
constexpr int kQueryTileMinTokens = 16;
// Otherwise steps of this many tokens or more (decode batches), and steps of kFewTokenTilesMin to
// kFewTokenTilesMax tokens, attend in its head tiles; the rest in its fp32 split kernel.
constexpr int kHeadTileMinTokens = 16;
constexpr int kFewTokenTilesMin = 4;
constexpr int kFewTokenTilesMax = 8;

float round_tf32(float v) {  // cvt.rna.tf32: to nearest, ties away from zero
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & ~0x1fffu;
  std::memcpy(&v, &u, 4);
  return v;
}

float truncate_tf32(float v) {  // an fp32 operand whose low mantissa bits the TF32 product ignores
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u &= ~0x1fffu;
  std::memcpy(&v, &u, 4);
  return v;
}

// The operands of one of the CUDA backend's tensor-core attention kernels.
struct TileOperands {
  int chunk_positions;          // the context is walked in chunks of this many positions
  float (*query)(float);        // q_lat and the rotated q_rope as the product reads them
  float (*entry)(float);        // cache entries, as keys and as values
  float (*probability)(float);  // unnormalised probabilities, for the product with the values
};
// Query tiles (mla_tensor_core.cu): bf16 operands, chunks of 32 positions.
constexpr TileOperands kQueryTiles{32, round_to_bf16, round_to_bf16, round_to_bf16};
// Head tiles (mla_decode_tiles.cu): TF32 queries and probabilities, fp32 entries read by the
// TF32 product as they are (their low bits ignored), chunks of 16 positions.
constexpr TileOperands kHeadTiles{16, round_tf32, truncate_tf32, round_tf32};

// One (token, head) as such a kernel computes it: scores with fp32 sums, an online softmax
// over the chunks whose unnormalised probabilities are rounded for the product with the
// values. entry_at(s) gives position s's entry in fp32.
void attend_in_tiles(const TileOperands& ops, std::vector<float>& q_lat, std::vector<float>& q_rope, int num_ctx,
                     float softmax_scale, const auto& entry_at, float* o_lat) {
  const int lora = static_cast<int>(q_lat.size()), rope = static_cast<int>(q_rope.size());
  for (float& v : q_lat) v = ops.query(v);
  for (float& v : q_rope) v = ops.query(v);
  const int chunk = ops.chunk_positions;
  std::vector<float> entries(static_cast<size_t>(chunk) * (lora + rope)), probs(chunk);
  float row_max = -INFINITY, row_sum = 0.0f;
  std::fill(o_lat, o_lat + lora, 0.0f);
  for (int c0 = 0; c0 < num_ctx; c0 += chunk) {
    const int n = std::min(chunk, num_ctx - c0);
    float m_new = row_max;
    for (int i = 0; i < n; ++i) {
      float* e = entries.data() + static_cast<int64_t>(i) * (lora + rope);
      const float* src = entry_at(c0 + i);
      for (int c = 0; c < lora + rope; ++c) e[c] = ops.entry(src[c]);
      probs[i] = (cpu::dot(q_lat.data(), e, lora) + cpu::dot(q_rope.data(), e + lora, rope)) * softmax_scale;
      m_new = std::max(m_new, probs[i]);
    }
    float chunk_sum = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float p = std::exp(probs[i] - m_new);
      chunk_sum += p;
      probs[i] = ops.probability(p);
    }
    const float rescale = row_max == -INFINITY ? 0.0f : std::exp(row_max - m_new);
    row_sum = row_sum * rescale + chunk_sum;
    row_max = m_new;
    for (int c = 0; c < lora; ++c) o_lat[c] *= rescale;
    for (int i = 0; i < n; ++i)
      cpu::axpy(probs[i], entries.data() + static_cast<int64_t>(i) * (lora + rope), o_lat, lora);
  }
  for (int c = 0; c < lora; ++c) o_lat[c] /= row_sum;
}

}  // namespace

void CpuBackend::mla_attention(const MlaAttentionArgs& args) {
  const MlaWeights& w = *args.weights;
  const ForwardBatch& batch = *args.batch;
  const int num_tokens = batch.num_tokens;
  const int lora = w.kv_lora_rank, rope = w.qk_rope_head_dim, nope = w.qk_nope_head_dim;
  const int vdim = w.v_head_dim, heads = w.num_heads;
  const int entry = lora + rope;
  const int q_stride = heads * (nope + rope);
  const int half = rope / 2;
  const float* cos_table = args.rope_cos->as<float>();
  const float* sin_table = args.rope_sin->as<float>();
  const bool fp8 = args.cache->format == KvCacheFormat::kFp8;
  const int64_t entry_bytes = static_cast<int64_t>(latent_entry_bytes(args.cache->format, lora, rope));
  auto* cache = static_cast<uint8_t*>(args.cache->data.data);
  const int bs = args.block_size;

  // 1. New tokens into the cache: normalised latent, rotated key rope part.
  std::vector<float> new_entry(entry);
  for (int t = 0; t < num_tokens; ++t) {
    if (batch.slot_mapping[t] < 0) continue;  // a padding token: nothing to store
    const float* src = args.kv_a->as<float>() + static_cast<int64_t>(t) * entry;
    uint8_t* dst = cache + static_cast<int64_t>(batch.slot_mapping[t]) * entry_bytes;
    float* e = fp8 ? new_entry.data() : reinterpret_cast<float*>(dst);
    cpu::rms_norm_row(src, w.kv_a_layernorm.as<float>(), lora, args.latent_norm_eps, e);
    std::copy(src + lora, src + entry, e + lora);
    const int pos = batch.positions[t];
    rotate_interleaved(e + lora, rope, cos_table + pos * half, sin_table + pos * half);
    if (fp8) quantize_latent_entry(e, lora, rope, dst);
  }

  // Tokens of the sequences whose chunk attends in the expanded form (none unless emulating it).
  std::vector<char> expanded(num_tokens, 0);
  if (roundings_.bf16_expanded_attention) {
    std::vector<int> new_tokens(batch.block_tables.size(), 0);
    for (int t = 0; t < num_tokens; ++t)
      if (batch.slot_mapping[t] >= 0) ++new_tokens[batch.token_seq[t]];
    for (int t = 0; t < num_tokens; ++t)
      expanded[t] = batch.slot_mapping[t] >= 0 && new_tokens[batch.token_seq[t]] >= kExpandedMinTokens;
    if (std::find(expanded.begin(), expanded.end(), 1) != expanded.end()) expanded_bf16_attention(args, expanded);
  }
  // The other tokens attend in query tiles where a sequence has kQueryTileMinTokens of them or
  // more (an fp32 cache only), all of them then; otherwise in head tiles where the CUDA backend
  // takes them (an fp32 cache here), as on CUDA (neither unless emulating them).
  const TileOperands* tiles = nullptr;
  if (!fp8 && (roundings_.bf16_query_tiles || roundings_.tf32_head_tiles)) {
    std::vector<int> other_tokens(batch.block_tables.size(), 0);
    int num_other = 0;
    bool long_chunk = false;
    for (int t = 0; t < num_tokens; ++t) {
      if (expanded[t]) continue;
      ++num_other;
      long_chunk = ++other_tokens[batch.token_seq[t]] >= kQueryTileMinTokens || long_chunk;
    }
    const bool head_tiles = num_other >= kHeadTileMinTokens ||
                            (num_other >= kFewTokenTilesMin && num_other <= kFewTokenTilesMax);
    if (long_chunk) tiles = roundings_.bf16_query_tiles ? &kQueryTiles : nullptr;
    else if (head_tiles && roundings_.tf32_head_tiles) tiles = &kHeadTiles;
  }

  // 2. Each (token, head): absorb W_UK into the query, attend over positions 0..pos of its
  // sequence, project the latent output through W_UV. Independent of the rest of the batch.
  const float* w_uk = w.w_uk.as<float>();  // [heads, nope, lora]
  const float* w_uv = w.w_uv.as<float>();  // [heads, vdim, lora]
  float* out = args.out->as<float>();
  global_thread_pool().parallel_for(static_cast<int64_t>(num_tokens) * heads, [&](int64_t b, int64_t e) {
    std::vector<float> q_lat(lora), q_rope(rope), scores, o_lat(lora), dequantized(entry);
    for (int64_t item = b; item < e; ++item) {
      const int t = static_cast<int>(item / heads), h = static_cast<int>(item % heads);
      if (expanded[t]) continue;
      const int pos = batch.positions[t];
      const float* q = args.q->as<float>() + static_cast<int64_t>(t) * q_stride + h * (nope + rope);
      // q_lat[l] = sum_d q_nope[d] * W_UK[h][d][l]
      std::fill(q_lat.begin(), q_lat.end(), 0.0f);
      const float* uk = w_uk + static_cast<int64_t>(h) * nope * lora;
      for (int d = 0; d < nope; ++d) cpu::axpy(q[d], uk + static_cast<int64_t>(d) * lora, q_lat.data(), lora);
      std::copy(q + nope, q + nope + rope, q_rope.begin());
      rotate_interleaved(q_rope.data(), rope, cos_table + pos * half, sin_table + pos * half);

      const auto& table = batch.block_tables[batch.token_seq[t]];
      // Position s's entry as fp32 [lora | rope].
      auto entry_at = [&](int s) -> const float* {
        const uint8_t* e = cache + (static_cast<int64_t>(table[s / bs]) * bs + s % bs) * entry_bytes;
        if (!fp8) return reinterpret_cast<const float*>(e);
        dequantize_latent_entry(e, lora, rope, dequantized.data());
        return dequantized.data();
      };
      const int num_ctx = pos + 1;  // causal: positions 0..pos are in the cache by now
      float* o = out + static_cast<int64_t>(t) * heads * vdim + h * vdim;
      const float* uv = w_uv + static_cast<int64_t>(h) * vdim * lora;
      if (tiles != nullptr) {
        attend_in_tiles(*tiles, q_lat, q_rope, num_ctx, args.softmax_scale, entry_at, o_lat.data());
        for (int v = 0; v < vdim; ++v) o[v] = cpu::dot(uv + static_cast<int64_t>(v) * lora, o_lat.data(), lora);
        continue;
      }
      scores.resize(num_ctx);
      float max_score = -INFINITY;
      for (int s = 0; s < num_ctx; ++s) {
        const float* kv = entry_at(s);
        const float sc = (cpu::dot(q_lat.data(), kv, lora) + cpu::dot(q_rope.data(), kv + lora, rope)) *
                         args.softmax_scale;
        scores[s] = sc;
        max_score = std::max(max_score, sc);
      }
      double denom = 0.0;
      for (int s = 0; s < num_ctx; ++s) {
        scores[s] = std::exp(scores[s] - max_score);
        denom += scores[s];
      }
      const float inv = static_cast<float>(1.0 / denom);
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      for (int s = 0; s < num_ctx; ++s) {
        const float* kv = entry_at(s);
        cpu::axpy(scores[s] * inv, kv, o_lat.data(), lora);
      }
      for (int v = 0; v < vdim; ++v) o[v] = cpu::dot(uv + static_cast<int64_t>(v) * lora, o_lat.data(), lora);
    }
  }, 1);
}

void CpuBackend::expanded_bf16_attention(const MlaAttentionArgs& args, const std::vector<char>& expanded) {
  const MlaWeights& w = *args.weights;
  const ForwardBatch& batch = *args.batch;
  const int lora = w.kv_lora_rank, rope = w.qk_rope_head_dim, nope = w.qk_nope_head_dim;
  const int vdim = w.v_head_dim, heads = w.num_heads, entry = lora + rope, half = rope / 2;
  const int q_stride = heads * (nope + rope);
  const bool fp8 = args.cache->format == KvCacheFormat::kFp8;
  const int64_t entry_bytes = static_cast<int64_t>(latent_entry_bytes(args.cache->format, lora, rope));
  const auto* cache = static_cast<const uint8_t*>(args.cache->data.data);
  const float* cos_table = args.rope_cos->as<float>();
  const float* sin_table = args.rope_sin->as<float>();
  const int bs = args.block_size;
  float* out = args.out->as<float>();
  // The up-projection's weights in bf16, as the expanded form keeps them: [heads, nope | vdim, lora].
  std::vector<float> w_uk(w.w_uk.as<float>(), w.w_uk.as<float>() + static_cast<int64_t>(heads) * nope * lora);
  std::vector<float> w_uv(w.w_uv.as<float>(), w.w_uv.as<float>() + static_cast<int64_t>(heads) * vdim * lora);
  for (float& v : w_uk) v = round_to_bf16(v);
  for (float& v : w_uv) v = round_to_bf16(v);

  for (size_t seq = 0; seq < batch.block_tables.size(); ++seq) {
    std::vector<int> tokens;
    for (int t = 0; t < batch.num_tokens; ++t)
      if (expanded[t] && batch.token_seq[t] == static_cast<int32_t>(seq)) tokens.push_back(t);
    if (tokens.empty()) continue;
    const auto& table = batch.block_tables[seq];
    const int context = batch.context_lens[seq];
    // The context's latent entries gathered in bf16: [context, lora | rope].
    std::vector<float> latent(static_cast<size_t>(context) * entry);
    for (int p = 0; p < context; ++p) {
      const uint8_t* e = cache + (static_cast<int64_t>(table[p / bs]) * bs + p % bs) * entry_bytes;
      float* dst = latent.data() + static_cast<int64_t>(p) * entry;
      if (fp8) dequantize_latent_entry(e, lora, rope, dst);
      else std::copy_n(reinterpret_cast<const float*>(e), entry, dst);
      for (int c = 0; c < entry; ++c) dst[c] = round_to_bf16(dst[c]);
    }
    global_thread_pool().parallel_for(heads, [&](int64_t h_begin, int64_t h_end) {
      std::vector<float> keys(static_cast<size_t>(context) * nope), values(static_cast<size_t>(context) * vdim);
      std::vector<float> q_nope(nope), q_rope(rope), probs;
      for (int64_t h = h_begin; h < h_end; ++h) {
        const float* uk = w_uk.data() + h * nope * lora;
        const float* uv = w_uv.data() + h * vdim * lora;
        for (int p = 0; p < context; ++p) {
          const float* lat = latent.data() + static_cast<int64_t>(p) * entry;
          for (int d = 0; d < nope; ++d)
            keys[static_cast<size_t>(p) * nope + d] =
                round_to_bf16(cpu::dot(uk + static_cast<int64_t>(d) * lora, lat, lora));
          for (int v = 0; v < vdim; ++v)
            values[static_cast<size_t>(p) * vdim + v] =
                round_to_bf16(cpu::dot(uv + static_cast<int64_t>(v) * lora, lat, lora));
        }
        for (const int t : tokens) {
          const int pos = batch.positions[t];
          const float* q = args.q->as<float>() + static_cast<int64_t>(t) * q_stride + h * (nope + rope);
          for (int d = 0; d < nope; ++d) q_nope[d] = round_to_bf16(q[d]);
          for (int r = 0; r < rope; ++r) q_rope[r] = round_to_bf16(q[nope + r]);
          rotate_interleaved(q_rope.data(), rope, cos_table + pos * half, sin_table + pos * half);
          for (float& v : q_rope) v = round_to_bf16(v);
          probs.resize(pos + 1);
          float max_score = -INFINITY;
          for (int p = 0; p <= pos; ++p) {
            const float* lat = latent.data() + static_cast<int64_t>(p) * entry;
            probs[p] = (cpu::dot(q_nope.data(), keys.data() + static_cast<int64_t>(p) * nope, nope) +
                        cpu::dot(q_rope.data(), lat + lora, rope)) *
                       args.softmax_scale;
            max_score = std::max(max_score, probs[p]);
          }
          float denom = 0.0f;
          for (int p = 0; p <= pos; ++p) {
            probs[p] = std::exp(probs[p] - max_score);
            denom += probs[p];
          }
          float* o = out + static_cast<int64_t>(t) * heads * vdim + h * vdim;
          std::fill(o, o + vdim, 0.0f);
          for (int p = 0; p <= pos; ++p)
            cpu::axpy(round_to_bf16(probs[p]), values.data() + static_cast<int64_t>(p) * vdim, o, vdim);
          for (int v = 0; v < vdim; ++v) o[v] /= denom;
        }
      }
    }, 1);
  }
}

}  // namespace dsinfer
