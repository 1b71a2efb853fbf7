// MLA attention of the CUDA backend against the CPU backend: ragged batches mixing prefill and
// decode, several block tables in shuffled block order, and contexts past 2k tokens (where the
// decode kernel splits the context). The cache before the step is random and written through
// write_cache_block on both backends, so every position of every context carries signal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "cuda_test_util.h"

namespace dsinfer {
namespace {

using testing_cuda::bf16_values;
using testing_cuda::CudaVsCpuTest;
using testing_cuda::download;
using testing_cuda::make_backend_with_env;
using testing_cuda::random_values;
using testing_cuda::relative_error;
using testing_cuda::upload;

struct Dims {
  int heads, lora, rope, nope, vdim;
};

struct SeqSpec {
  int num_cached;  // tokens already in the cache
  int num_new;     // tokens of this step
};

// The queries made by Backend::mla_queries from hidden rows of this width, instead of given.
struct QueryProjection {
  int hidden;
  // Whether the CUDA backend is to keep them in bf16 only, leaving the fp32 rows unwritten.
  bool bf16_only;
};

class CudaAttentionTest : public CudaVsCpuTest {
 protected:
  // Steps of this many tokens run in head tiles on gpu_ (TF32 products): the backend's default
  // bounds, unless a test sets others.
  int few_token_tiles_min_ = 4, few_token_tiles_max_ = 8;
  // Steps of fewer than 16 tokens whose contexts together have this many positions or more run
  // in those tiles too (the backend's default; 0 where a test turns the tiles off).
  int long_context_tiles_min_ = 2560;
  // other_gpu: a second CUDA backend that must give the same bits as the first.
  void run_case(const Dims& d, const std::vector<SeqSpec>& seqs, uint32_t seed,
                KvCacheFormat format = KvCacheFormat::kF32, Backend* other_gpu = nullptr,
                const QueryProjection* projection = nullptr) {
    constexpr int kBlockSize = 64;
    const int entry = d.lora + d.rope;
    const bool fp8 = format == KvCacheFormat::kFp8;
    const size_t entry_bytes = latent_entry_bytes(format, d.lora, d.rope);
    // Block tables: every sequence gets its blocks from a shuffled pool.
    int total_blocks = 0;
    for (const auto& s : seqs) total_blocks += (s.num_cached + s.num_new + kBlockSize - 1) / kBlockSize;
    std::vector<int32_t> pool(total_blocks + 3);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), std::mt19937(seed));
    ForwardBatch batch;
    int next_block = 0, max_pos = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int ctx = seqs[s].num_cached + seqs[s].num_new;
      std::vector<int32_t> table;
      for (int i = 0; i < (ctx + kBlockSize - 1) / kBlockSize; ++i) table.push_back(pool[next_block++]);
      for (int p = seqs[s].num_cached; p < ctx; ++p) {
        batch.token_ids.push_back(1);
        batch.positions.push_back(p);
        batch.slot_mapping.push_back(table[p / kBlockSize] * kBlockSize + p % kBlockSize);
        batch.token_seq.push_back(static_cast<int32_t>(s));
        max_pos = std::max(max_pos, p);
      }
      batch.block_tables.push_back(table);
      batch.context_lens.push_back(ctx);
    }
    batch.num_tokens = static_cast<int>(batch.positions.size());
    const int64_t t = batch.num_tokens, num_blocks = static_cast<int64_t>(pool.size());

    const int64_t q_width = int64_t{d.heads} * (d.nope + d.rope);
    const auto q = random_values(t * q_width, seed + 1);
    // With a projection: hidden rows and a query weight that give queries of about unit size.
    const int hidden = projection != nullptr ? projection->hidden : 0;
    const auto x = random_values(t * hidden, seed + 8);
    const auto wq =
        bf16_values(random_values(q_width * hidden, seed + 9, hidden > 0 ? 1.0f / std::sqrt(float(hidden)) : 1.0f));
    constexpr float kUnwritten = 12345.0f;
    const auto kv_a = random_values(t * entry, seed + 2, 1.5f);
    const auto norm_w = random_values(d.lora, seed + 3, 0.1f, 1.0f);
    const auto w_uk = random_values(static_cast<size_t>(d.heads) * d.nope * d.lora, seed + 4, 0.1f);
    const auto w_uv = random_values(static_cast<size_t>(d.heads) * d.vdim * d.lora, seed + 5, 0.1f);
    const int half = d.rope / 2, max_positions = max_pos + 1;
    std::vector<float> cos_t(max_positions * half), sin_t(max_positions * half);
    for (int p = 0; p < max_positions; ++p)
      for (int i = 0; i < half; ++i) {
        const double freq = std::pow(10000.0, -2.0 * i / d.rope);
        cos_t[p * half + i] = static_cast<float>(std::cos(p * freq));
        sin_t[p * half + i] = static_cast<float>(std::sin(p * freq));
      }
    const auto initial_cache = random_values(num_blocks * kBlockSize * entry, seed + 6, 0.5f);
    // The cache as stored: the fp32 entries, or each quantised into its FP8 bytes.
    std::vector<uint8_t> initial_bytes(num_blocks * kBlockSize * entry_bytes);
    for (int64_t e = 0; e < num_blocks * kBlockSize; ++e) {
      if (fp8) quantize_latent_entry(initial_cache.data() + e * entry, d.lora, d.rope, initial_bytes.data() + e * entry_bytes);
      else std::memcpy(initial_bytes.data() + e * entry_bytes, initial_cache.data() + e * entry, entry_bytes);
    }

    std::vector<Backend*> bes = {cpu_.get(), gpu_.get()};
    if (other_gpu != nullptr) bes.push_back(other_gpu);
    std::vector<float> out[3], cache_after[3];
    for (size_t b = 0; b < bes.size(); ++b) {
      Backend& be = *bes[b];
      MlaWeights w;
      w.num_heads = d.heads;
      w.kv_lora_rank = d.lora;
      w.qk_nope_head_dim = d.nope;
      w.qk_rope_head_dim = d.rope;
      w.v_head_dim = d.vdim;
      w.kv_a_layernorm = upload(be, {d.lora}, norm_w);
      w.w_uk = upload(be, {d.heads, d.nope, d.lora}, w_uk);
      w.w_uv = upload(be, {d.heads, d.vdim, d.lora}, w_uv);
      be.prepare(w);
      Tensor tq = upload(be, {t, q_width}, projection != nullptr ? std::vector<float>(t * q_width, kUnwritten) : q);
      Tensor tkv = upload(be, {t, entry}, kv_a);
      if (projection != nullptr) {
        const LinearWeight wq_linear = be.make_linear(HostTensor{DType::kF32, {q_width, hidden}, wq.data()});
        be.mla_queries(upload(be, {t, hidden}, x), wq_linear, w, batch, tq);
      }
      Tensor tcos = upload(be, {max_positions, half}, cos_t), tsin = upload(be, {max_positions, half}, sin_t);
      const DType dtype = latent_cache_dtype(format);
      LayerKvCache cache{
          be.empty({num_blocks, kBlockSize, static_cast<int64_t>(entry_bytes / dtype_size_bytes(dtype))}, dtype),
          format};
      for (int64_t blk = 0; blk < num_blocks; ++blk)
        be.write_cache_block(cache, static_cast<int32_t>(blk), initial_bytes.data() + blk * kBlockSize * entry_bytes);
      Tensor tout = be.empty({t, d.heads * d.vdim}, DType::kF32);
      MlaAttentionArgs args;
      args.weights = &w;
      args.q = &tq;
      args.kv_a = &tkv;
      args.rope_cos = &tcos;
      args.rope_sin = &tsin;
      args.batch = &batch;
      args.cache = &cache;
      args.block_size = kBlockSize;
      args.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope));
      args.out = &tout;
      be.mla_attention(args);
      out[b] = download(be, tout);
      if (projection != nullptr && b == 1) {
        const auto q_after = download(be, tq);
        const bool unwritten = std::all_of(q_after.begin(), q_after.end(), [](float v) { return v == kUnwritten; });
        EXPECT_EQ(unwritten, projection->bf16_only) << "the fp32 query rows left unwritten";
      }
      if (b > 0) {
        // The product after the attention (o_proj) reads its output in bf16: in steps of a few
        // tokens from the copy the attention's last product wrote, which must hold the bits a
        // conversion of the output gives.
        const int64_t width = int64_t{d.heads} * d.vdim, n_out = 64;
        const auto wo = bf16_values(random_values(n_out * width, seed + 7, 0.05f));
        const LinearWeight o_proj = be.make_linear(HostTensor{DType::kF32, {n_out, width}, wo.data()});
        Tensor got = be.empty({t, n_out}, DType::kF32), want = be.empty({t, n_out}, DType::kF32);
        be.linear(tout, o_proj, got);
        Tensor fresh = upload(be, {t, width}, out[b]);
        be.linear(fresh, o_proj, want);
        EXPECT_EQ(download(be, got), download(be, want)) << "o_proj after the attention";
      }
      std::vector<uint8_t> bytes(initial_bytes.size());
      for (int64_t blk = 0; blk < num_blocks; ++blk)
        be.read_cache_block(cache, static_cast<int32_t>(blk), bytes.data() + blk * kBlockSize * entry_bytes);
      cache_after[b].resize(num_blocks * kBlockSize * entry);
      for (int64_t e = 0; e < num_blocks * kBlockSize; ++e) {
        if (fp8) dequantize_latent_entry(bytes.data() + e * entry_bytes, d.lora, d.rope, cache_after[b].data() + e * entry);
        else std::memcpy(cache_after[b].data() + e * entry, bytes.data() + e * entry_bytes, entry_bytes);
      }
    }
    // An FP8 entry may land one e4m3 step apart where the two backends' norms differ in the
    // last bit.
    EXPECT_LT(relative_error(cache_after[1], cache_after[0]), fp8 ? 1e-2 : 1e-5) << "cache after the step";
    // Prefill chunks of 16 tokens or more, and decode batches of 16 tokens or more, run on
    // tensor cores (bf16 or TF32 operands, fp32 softmax and sums);
    // smaller decode batches (but those in few_token_tiles_min_..max_ tokens), and all decode in
    // batch-invariant mode, stay in fp32.
    const char* invariant_env = std::getenv("DSINFER_BATCH_INVARIANT");
    const bool invariant = invariant_env != nullptr && std::string(invariant_env) == "1";
    bool prefill_chunk = false;
    for (const auto& sq : seqs) prefill_chunk = prefill_chunk || sq.num_new >= 16;
    // An FP8 cache widens its entries to fp32 in every kernel that reads them (decode batches
    // of 16 tokens or more: in the head tiles, TF32), over entries that may differ by one e4m3
    // step where they were just written.
    int num_positions = 0;
    for (const auto& sq : seqs) num_positions += sq.num_cached + sq.num_new;
    const bool long_context = few_token_tiles_max_ > 0 && long_context_tiles_min_ > 0 &&
                              num_positions >= long_context_tiles_min_;
    const bool in_few_token_tiles =
        !invariant && ((t >= few_token_tiles_min_ && t <= few_token_tiles_max_) || (t < 16 && long_context));
    const bool fp32 = !prefill_chunk && (invariant || t < 16) && !in_few_token_tiles;
    EXPECT_LT(relative_error(out[1], out[0]), fp32 && !fp8 ? 1e-4 : 2e-2) << "attention output";
    if (other_gpu != nullptr) {
      EXPECT_EQ(out[2], out[1]) << "attention output on the second CUDA backend";
      EXPECT_EQ(cache_after[2], cache_after[1]) << "cache on the second CUDA backend";
    }
  }
};

const Dims kV3Dims{4, 512, 64, 128, 128};
const Dims kTinyDims{3, 32, 16, 24, 20};

TEST_F(CudaAttentionTest, RaggedBatchMixingPrefillAndDecode) {
  run_case(kV3Dims, {{0, 5}, {70, 1}, {130, 3}, {0, 1}, {63, 2}}, 100);
  run_case(kTinyDims, {{0, 17}, {64, 1}, {5, 9}}, 200);
}

// The split kernel, its long-context tiles off (DSINFER_MLA_LONG_CONTEXT_TILES=0).
TEST_F(CudaAttentionTest, LongContextDecodeSplitsTheContext) {
  gpu_ = make_backend_with_env("cuda", "DSINFER_MLA_LONG_CONTEXT_TILES", "0");
  long_context_tiles_min_ = 0;
  run_case(kV3Dims, {{2100, 1}}, 300);                    // one sequence: many splits
  run_case(kV3Dims, {{2500, 1}, {40, 1}, {1200, 1}}, 400);  // uneven contexts in one step
  run_case(kTinyDims, {{3000, 1}}, 500);
}

// Steps of fewer than 16 tokens whose contexts together have 2,560 positions or more attend in
// the few-token head tiles, whatever their number of tokens, at as many runs a token as fill the
// GPU, up to 64 runs, 128 from a context of 8,192 positions and 256 from 16,384 (22 for 12
// tokens on a 132-SM GPU): one long context at each of those, two of half the threshold, two at
// 128 runs (merged past the split kernel's 64 by the combine kernel's other form), long and
// short ones together, 12 tokens (past the few-token tiles' own 4 to 8), new tokens of one
// sequence attending to one another, a second and partly empty head tile, both caches, against
// the CPU. A context of 2,559 positions stays in the split kernel, within its fp32 bound.
TEST_F(CudaAttentionTest, LongContextsOfFewTokensAttendInHeadTiles) {
  for (KvCacheFormat format : {KvCacheFormat::kF32, KvCacheFormat::kFp8}) {
    run_case(kV3Dims, {{4000, 1}}, 5000, format);
    run_case(kV3Dims, {{9000, 1}}, 5001, format);
    run_case(kV3Dims, {{17000, 1}}, 5002, format);
    run_case(kV3Dims, {{1300, 1}, {1300, 1}}, 5010, format);
    run_case(kV3Dims, {{9000, 1}, {8500, 1}}, 5015, format);
    run_case(kV3Dims, {{4000, 1}, {3, 1}}, 5020, format);
  }
  std::vector<SeqSpec> twelve;
  for (int i = 0; i < 12; ++i) twelve.push_back({i == 5 ? 5000 : (i * 701) % 3000, 1});
  run_case(kV3Dims, twelve, 5030);
  run_case(kV3Dims, {{3000, 3}}, 5040);
  run_case({20, 32, 16, 24, 20}, {{2700, 1}}, 5050);
  run_case(kTinyDims, {{4100, 1}, {10, 1}}, 5060);
  run_case(kV3Dims, {{2558, 1}}, 5070);
}

// A long-context decode step is recorded apart for the runs a token its attention takes: steps
// of many tokens, whose runs the GPU's tile slots cap below what their contexts call for, keep
// one recording however long their contexts grow (four tokens on 132 SMs: the split kernel's 64
// runs at 5k, 9k and 17k positions, where the most runs are 64, 128 and 256), while one token's
// runs grow with its context as far as the slots allow.
TEST_F(CudaAttentionTest, LongContextStepsAreRecordedApartOnlyWhereTheirRunsDiffer) {
  auto step = [](int num_tokens, int context_len) {
    ForwardBatch batch;
    batch.num_tokens = num_tokens;
    batch.context_lens.assign(num_tokens, context_len);
    return batch;
  };
  run_case(kV3Dims, {{9000, 1}}, 5100);  // tells the backend the tiles' blocks at these widths
  const uint32_t four_short = gpu_->recording_variant(step(4, 5000));
  EXPECT_GT(four_short, 0u);
  EXPECT_LE(four_short, 64u);  // 64 on 132 SMs: 264 tiles over four tokens, capped at 64
  EXPECT_EQ(gpu_->recording_variant(step(4, 9000)), four_short);
  EXPECT_EQ(gpu_->recording_variant(step(4, 17000)), four_short);
  const uint32_t eight = gpu_->recording_variant(step(8, 5000));
  EXPECT_GT(eight, 0u);
  EXPECT_LE(eight, 64u);
  EXPECT_EQ(gpu_->recording_variant(step(8, 17000)), eight);
  const uint32_t one_short = gpu_->recording_variant(step(1, 5000));
  const uint32_t one_long = gpu_->recording_variant(step(1, 17000));
  EXPECT_EQ(one_short, 64u);
  EXPECT_GT(one_long, one_short) << "a GPU of 64 SMs or more holds 128 tiles of these widths";
  EXPECT_EQ(gpu_->recording_variant(step(1, 2000)), 0u) << "below the threshold: the split kernel";
}

TEST_F(CudaAttentionTest, SplitKernelOfDeepSeekWidthsGivesTheGenericFormsBits) {
  // Decode steps of fewer than 16 tokens may attend in the split kernel (pinned here: steps of 4
  // to 8 tokens take the few-token head tiles by default), whose forms for 512 latent
  // and 64 rope columns in 64-position blocks (fp32 and FP8 caches) read each lane's columns at
  // fixed offsets; DSINFER_MLA_SPLIT_GENERIC=1 takes the form that reads the widths from
  // MlaDims. Same columns a lane, same order of sums: the same bits, for one and several
  // sequences, contexts from one position to past 2k, and splits left empty.
  setenv("DSINFER_MLA_FEW_TOKEN_TILES", "0", 1);
  few_token_tiles_max_ = 0;
  gpu_ = make_backend("cuda");
  auto generic = make_backend_with_env("cuda", "DSINFER_MLA_SPLIT_GENERIC", "1");
  unsetenv("DSINFER_MLA_FEW_TOKEN_TILES");
  for (KvCacheFormat format : {KvCacheFormat::kF32, KvCacheFormat::kFp8}) {
    run_case(kV3Dims, {{2100, 1}}, 800, format, generic.get());
    run_case(kV3Dims, {{0, 1}, {700, 1}, {63, 1}, {64, 1}, {1500, 1}}, 810, format, generic.get());
    run_case(kV3Dims, {{61, 4}}, 820, format, generic.get());
  }
}

TEST_F(CudaAttentionTest, SplitKernelScoringOneOrFourPositionsAtOnceFollowsTheCpu) {
  // Split grids that fit in one wave score four positions a warp at once, larger ones one at a
  // time (DSINFER_MLA_SPLIT_GROUP fixes either): two orders of the running softmax's sums, each
  // within the fp32 bound of the CPU, for both caches, both kernel forms (DeepSeek's widths
  // and the generic one), groups cut short by a split's end and splits left empty. And the
  // fixed and generic forms of each keep the same bits.
  setenv("DSINFER_MLA_FEW_TOKEN_TILES", "0", 1);  // steps of 4 to 8 tokens in the split kernel too
  few_token_tiles_max_ = 0;
  for (const char* group : {"1", "4"}) {
    SCOPED_TRACE(std::string("DSINFER_MLA_SPLIT_GROUP=") + group);
    gpu_ = make_backend_with_env("cuda", "DSINFER_MLA_SPLIT_GROUP", group);
    for (KvCacheFormat format : {KvCacheFormat::kF32, KvCacheFormat::kFp8}) {
      run_case(kV3Dims, {{2100, 1}}, 900, format);
      run_case(kV3Dims, {{0, 1}, {700, 1}, {63, 1}, {66, 1}, {1500, 1}}, 910, format);
      run_case(kV3Dims, {{61, 4}, {3, 1}}, 920, format);
    }
    run_case(kTinyDims, {{3000, 1}, {1, 1}, {37, 2}}, 930);
    setenv("DSINFER_MLA_SPLIT_GROUP", group, 1);
    auto generic = make_backend_with_env("cuda", "DSINFER_MLA_SPLIT_GENERIC", "1");
    unsetenv("DSINFER_MLA_SPLIT_GROUP");
    run_case(kV3Dims, {{1300, 1}, {5, 1}}, 940, KvCacheFormat::kF32, generic.get());
    run_case(kV3Dims, {{2100, 1}}, 950, KvCacheFormat::kFp8, generic.get());
  }
  unsetenv("DSINFER_MLA_FEW_TOKEN_TILES");
}

TEST_F(CudaAttentionTest, CacheWriteBesideTheQueryProductGivesTheSameBits) {
  // Steps of up to four tokens write their cache entries in the W_UK product's launch, and the
  // split kernel then reads the newest entries only after its wait;
  // DSINFER_MLA_CACHE_WRITE_BESIDE=0 writes them in a launch of their own first. Same bits
  // either way, for one to four tokens: decodes of several sequences, and four new tokens of one
  // sequence (each attending to the entries its predecessors wrote in the same step), fp32 and
  // FP8 caches; with 3 heads and one k slice, four tokens find too few blocks beside the
  // product and take the launch of their own.
  auto separate = make_backend_with_env("cuda", "DSINFER_MLA_CACHE_WRITE_BESIDE", "0");
  run_case(kV3Dims, {{2100, 1}}, 700, KvCacheFormat::kF32, separate.get());
  run_case(kV3Dims, {{0, 1}, {700, 1}}, 710, KvCacheFormat::kF32, separate.get());
  run_case(kV3Dims, {{2500, 1}, {40, 1}, {1200, 1}, {5, 1}}, 720, KvCacheFormat::kFp8, separate.get());
  run_case(kV3Dims, {{61, 4}}, 730, KvCacheFormat::kF32, separate.get());
  run_case(kV3Dims, {{0, 4}}, 740, KvCacheFormat::kFp8, separate.get());
  run_case(kTinyDims, {{3000, 1}, {1, 1}}, 750, KvCacheFormat::kF32, separate.get());
  run_case(kTinyDims, {{300, 1}, {9, 1}, {64, 1}, {2, 1}}, 760, KvCacheFormat::kF32, separate.get());
}

TEST_F(CudaAttentionTest, SplitMergeBesideTheOutputProductGivesTheSameBits) {
  // Split-path steps of up to DSINFER_MLA_MERGE_BESIDE_W_UV tokens (two by default, up to four)
  // merge their splits in the W_UV product's launch, each block its own 64 latent columns of
  // every token's head with the combine's arithmetic; 0 merges them in a launch of their own
  // first. Same bits either way: splits from the split kernel (one to four tokens, one and
  // several sequences, contexts from one position to past 2k, splits left empty, fp32 and FP8
  // caches, a latent of 32 columns that fills half a slice) and from the few-token head tiles
  // (four to eight tokens: four merge beside, eight in their own launch). The default backend
  // merges steps of one and two tokens beside.
  auto separate = make_backend_with_env("cuda", "DSINFER_MLA_MERGE_BESIDE_W_UV", "0");
  run_case(kV3Dims, {{2100, 1}}, 1690, KvCacheFormat::kF32, separate.get());
  run_case(kV3Dims, {{700, 1}, {1500, 1}}, 1695, KvCacheFormat::kFp8, separate.get());
  gpu_ = make_backend_with_env("cuda", "DSINFER_MLA_MERGE_BESIDE_W_UV", "4");
  run_case(kV3Dims, {{61, 4}}, 1700, KvCacheFormat::kF32, separate.get());
  run_case(kV3Dims, {{1300, 1}, {5, 1}, {0, 1}, {2200, 1}}, 1710, KvCacheFormat::kFp8, separate.get());
  run_case(kV3Dims, {{900, 1}, {40, 1}, {64, 1}, {7, 1}, {1200, 1}, {3, 1}, {2, 1}, {600, 1}}, 1720,
           KvCacheFormat::kF32, separate.get());
  setenv("DSINFER_MLA_FEW_TOKEN_TILES", "0", 1);  // steps of four tokens in the split kernel too
  few_token_tiles_max_ = 0;
  gpu_ = make_backend_with_env("cuda", "DSINFER_MLA_MERGE_BESIDE_W_UV", "4");
  separate = make_backend_with_env("cuda", "DSINFER_MLA_MERGE_BESIDE_W_UV", "0");
  unsetenv("DSINFER_MLA_FEW_TOKEN_TILES");
  for (KvCacheFormat format : {KvCacheFormat::kF32, KvCacheFormat::kFp8}) {
    run_case(kV3Dims, {{2100, 1}}, 1730, format, separate.get());
    run_case(kV3Dims, {{0, 1}, {700, 1}}, 1740, format, separate.get());
    run_case(kV3Dims, {{2500, 1}, {40, 1}, {1200, 1}, {5, 1}}, 1750, format, separate.get());
    run_case(kV3Dims, {{61, 4}}, 1760, format, separate.get());
  }
  run_case(kTinyDims, {{3000, 1}, {1, 1}}, 1770, KvCacheFormat::kF32, separate.get());
}

// 16 decode tokens or more attend in head tiles: contexts from one position to past 2k, so some
// tokens use one split and others many, the rest of their splits left empty.
// The FP8 latent cache: decode alone (the fp32 split kernel) and in a batch of 20 with long
// contexts (head tiles, which widen each chunk as it arrives), chunks of 16 to 80 tokens in the
// expanded form, whose gather dequantises the entries, beside decodes and a short chunk; then,
// the expanded form turned off, the same chunks in the head tiles (query tiles take fp32 entries
// only).
TEST_F(CudaAttentionTest, Fp8LatentCache) {
  run_case(kV3Dims, {{2100, 1}}, 3000, KvCacheFormat::kFp8);
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < 20; ++i) seqs.push_back({(i * 131) % 2600, 1});
  run_case(kV3Dims, seqs, 3100, KvCacheFormat::kFp8);
  run_case(kV3Dims, {{100, 16}, {0, 70}, {40, 1}}, 3200, KvCacheFormat::kFp8);
  run_case(kTinyDims, {{0, 17}, {64, 1}, {5, 9}, {0, 80}}, 3300, KvCacheFormat::kFp8);
  testing_cuda::ScopedEnv absorbed("DSINFER_MLA_EXPANDED_MIN_TOKENS", "1000000");
  gpu_ = make_backend("cuda");
  run_case(kV3Dims, {{100, 16}, {0, 70}, {40, 1}}, 3400, KvCacheFormat::kFp8);
  run_case(kTinyDims, {{0, 17}, {64, 1}, {5, 9}, {0, 80}}, 3500, KvCacheFormat::kFp8);
}

TEST_F(CudaAttentionTest, HeadTilesWithLessWorkThanBlocks) {
  // 16 decodes of 18 to 63 positions are less work than the head tiles have blocks, so blocks
  // with empty ranges sit between the blocks that hold a token's chunks. Those write no partial
  // result, and their slots hold what the step before left there: the merge must skip them.
  // Each short step follows a long one of as many tokens, whose workspace has the same size (so
  // the allocator hands the same memory back) and whose blocks all wrote their slots.
  std::vector<SeqSpec> longer, shorter;
  for (int i = 0; i < 16; ++i) {
    longer.push_back({1500 + 37 * i, 1});
    shorter.push_back({17 + 3 * i, 1});
  }
  for (KvCacheFormat format : {KvCacheFormat::kF32, KvCacheFormat::kFp8}) {
    run_case(kV3Dims, longer, 1700, format);
    run_case(kV3Dims, shorter, 1800, format);
  }
}

TEST_F(CudaAttentionTest, DecodeBatchInHeadTiles) {
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < 20; ++i) seqs.push_back({(i * 131) % 2600, 1});
  run_case(kV3Dims, seqs, 1400);
  run_case({16, 512, 64, 128, 128}, {seqs.begin(), seqs.begin() + 16}, 1500);
  run_case({20, 32, 16, 24, 20}, seqs, 1600);  // 20 heads: a second, partly empty head tile
}

// A batch of 16 tokens or more whose sequences bring up to 15 new tokens each (a chunked
// prefill's remainder beside decodes) also runs in head tiles: each token attends causally up
// to its own position, past the entries its later neighbours have just written.
TEST_F(CudaAttentionTest, HeadTilesTakeShortChunksBesideDecodes) {
  std::vector<SeqSpec> seqs{{300, 5}, {40, 3}, {0, 7}};
  for (int i = 0; i < 10; ++i) seqs.push_back({(i * 577) % 2000, 1});
  run_case(kV3Dims, seqs, 2200);
  run_case(kTinyDims, seqs, 2300);
}

// Head tiles cut the batch's work into equal ranges whatever the contexts: one long context
// spread over many blocks beside short ones taken several to a block, and more tokens than
// blocks.
TEST_F(CudaAttentionTest, HeadTilesBalanceMixedContextLengths) {
  std::vector<SeqSpec> seqs{{5000, 1}};
  for (int i = 0; i < 40; ++i) seqs.push_back({i % 7, 1});
  run_case(kV3Dims, seqs, 2000);
  std::vector<SeqSpec> many;
  for (int i = 0; i < 300; ++i) many.push_back({(i * 37) % 400, 1});
  run_case(kTinyDims, many, 2100);
}

// Steps of few tokens may attend in head tiles without a plan (DSINFER_MLA_FEW_TOKEN_TILES=N:
// N runs of each token's context per head group, merged by the split kernel's combine; up to
// DSINFER_MLA_FEW_TOKEN_TILES_MAX tokens): contexts of one position, of fewer chunks than runs
// (runs left empty, which the combine must skip) and of many, both caches, a second and partly
// empty head tile, against the CPU; a step of more tokens beside them takes the kernels of its
// size.
TEST_F(CudaAttentionTest, FewTokensInHeadTilesFollowTheCpu) {
  setenv("DSINFER_MLA_FEW_TOKEN_TILES_MIN", "1", 1);
  setenv("DSINFER_MLA_FEW_TOKEN_TILES_MAX", "3", 1);
  for (const char* runs : {"64", "32", "7"}) {
    SCOPED_TRACE(std::string("DSINFER_MLA_FEW_TOKEN_TILES=") + runs);
    gpu_ = make_backend_with_env("cuda", "DSINFER_MLA_FEW_TOKEN_TILES", runs);
    few_token_tiles_min_ = 1;
    few_token_tiles_max_ = 3;
    for (KvCacheFormat format : {KvCacheFormat::kF32, KvCacheFormat::kFp8}) {
      run_case(kV3Dims, {{2100, 1}}, 4000, format);
      run_case(kV3Dims, {{0, 1}}, 4010, format);
      run_case(kV3Dims, {{40, 1}, {1023, 1}}, 4020, format);
      run_case(kV3Dims, {{1023, 1}, {5, 1}, {77, 1}, {300, 1}}, 4030, format);
    }
    run_case({20, 32, 16, 24, 20}, {{700, 1}}, 4040);
    run_case(kTinyDims, {{3000, 1}, {64, 1}}, 4050);
  }
  // The blocks request a first chunk ahead of their wait where it ends before the entries the
  // launch before writes: the token's own, and those of the step's tokens before it in its
  // sequence (three new tokens of one sequence here, each attending to the ones before it);
  // DSINFER_MLA_FEW_TOKEN_TILES_EARLY=0 requests it after the wait.
  for (const char* early : {"1", "0"}) {
    SCOPED_TRACE(std::string("DSINFER_MLA_FEW_TOKEN_TILES_EARLY=") + early);
    setenv("DSINFER_MLA_FEW_TOKEN_TILES_EARLY", early, 1);
    gpu_ = make_backend_with_env("cuda", "DSINFER_MLA_FEW_TOKEN_TILES", "32");
    run_case(kV3Dims, {{2100, 1}}, 4060);
    run_case(kV3Dims, {{46, 3}}, 4070);
    run_case(kV3Dims, {{40, 1}, {94, 2}}, 4080, KvCacheFormat::kFp8);
  }
  unsetenv("DSINFER_MLA_FEW_TOKEN_TILES_EARLY");
  unsetenv("DSINFER_MLA_FEW_TOKEN_TILES_MIN");
  unsetenv("DSINFER_MLA_FEW_TOKEN_TILES_MAX");
}

TEST_F(CudaAttentionTest, LongPrefillChunkAfterCachedPrefix) {
  run_case(kV3Dims, {{1900, 200}}, 600);
  run_case({16, 512, 64, 128, 128}, {{0, 300}, {100, 2}}, 700);
  // Chunks that are not whole 16-token tiles or 32-position key chunks, next to decodes.
  run_case(kTinyDims, {{0, 37}, {45, 1}, {70, 19}, {3, 16}}, 800);
}

// Chunks of 16 new tokens or more attend in the expanded form, also after a long cached prefix
// (a follow-up turn of a conversation), beside decodes, beside a long context's chunk of 15
// tokens, which stays absorbed, and beside a short context's chunk of 16.
TEST_F(CudaAttentionTest, FollowUpChunksOverLongCachedPrefixesAttendExpanded) {
  run_case(kV3Dims, {{5000, 20}}, 1300);
  run_case(kV3Dims, {{3000, 16}, {40, 1}, {1200, 1}}, 1310);
  run_case(kV3Dims, {{2000, 15}, {30, 16}, {1010, 20}}, 1320);
}

// Where the expanded form is not taken (head widths it cannot align, keys and values past 4 GiB;
// here DSINFER_MLA_EXPANDED_MIN_TOKENS turns it off), chunks of 16 new tokens or more attend in
// query tiles, every token of their step with them; where the tiles' blocks are too few to fill
// the GPU, each tile's context is cut into runs of at least 256 positions (up to 64 runs), merged
// by the split path's combine: one chunk over a long cached prefix (19 runs on a GPU of 132 SMs),
// one beside decodes of long and short contexts, four tiles of one chunk (the last partly
// filled), a chunk of exactly one tile, tiny widths, 64 runs (the most; the last one empty), and
// four runs where the runs' floor of 256 positions binds; then short contexts, in one run: chunks
// that are not whole 16-token tiles or 32-position key chunks, beside decodes and short steps.
TEST_F(CudaAttentionTest, QueryTilesOverLongCachedPrefixesSplitTheirContexts) {
  testing_cuda::ScopedEnv absorbed("DSINFER_MLA_EXPANDED_MIN_TOKENS", "1000000");
  gpu_ = make_backend("cuda");
  run_case(kV3Dims, {{5000, 20}}, 1400);
  run_case(kV3Dims, {{3000, 16}, {40, 1}, {1200, 1}}, 1410);
  run_case(kV3Dims, {{9000, 63}}, 1420);
  run_case(kTinyDims, {{4100, 17}, {10, 1}}, 1430);
  run_case(kTinyDims, {{20000, 16}}, 1440);
  run_case(kTinyDims, {{0, 37}, {45, 1}, {70, 19}, {3, 16}}, 1460);
  run_case(kTinyDims, {{0, 17}, {64, 1}, {5, 9}}, 1470);
  run_case(kV3Dims, {{0, 5}, {70, 1}, {130, 3}, {0, 17}, {63, 2}}, 1480);
  testing_cuda::ScopedEnv blocks("DSINFER_MLA_QUERY_TILE_BLOCKS", "64");
  gpu_ = make_backend("cuda");
  run_case(kV3Dims, {{1000, 30}}, 1450);
}

// Chunks of 16 new tokens or more attend in the expanded form (up-projected keys and values);
// in a mixed batch the other tokens are compacted into the absorbed kernels
// and their outputs scattered back.
TEST_F(CudaAttentionTest, ExpandedChunksBesideTilesAndDecodes) {
  run_case(kTinyDims, {{0, 37}, {45, 1}, {130, 90}, {3, 16}, {0, 64}, {200, 1}}, 900);
  run_case(kV3Dims, {{0, 5}, {64, 70}, {10, 1}}, 1000);
}

TEST_F(CudaAttentionTest, ExpandedChunkInSeveralQueryBlocks) {
  run_case(kTinyDims, {{0, 1100}}, 1100);        // three blocks of at most 512 queries
  run_case(kV3Dims, {{300, 700}, {20, 1}}, 1200);  // a cached prefix before the first block
  run_case(kTinyDims, {{4200, 64}}, 1250);          // rows past the softmax's 4096 cached keys
}

// A step's expanded chunks share one up-projection of their keys and values: each chunk must read
// its own context's rows of it, whatever the lengths before it.
TEST_F(CudaAttentionTest, ExpandedChunksShareOneUpProjection) {
  run_case(kV3Dims, {{0, 200}, {150, 64}, {10, 1}, {1000, 100}}, 1300);
  run_case(kTinyDims, {{37, 70}, {0, 640}, {3, 1}, {500, 65}}, 1350);
}

// DSINFER_MLA_FLASH=0: the expanded form's scores go through memory between cuBLASLt products
// instead of staying in the fused kernel's shared memory; both must match the reference.
TEST_F(CudaAttentionTest, ExpandedChunksThroughLibraryProducts) {
  gpu_ = make_backend_with_env("cuda", "DSINFER_MLA_FLASH", "0");
  run_case(kTinyDims, {{0, 37}, {45, 1}, {130, 90}, {3, 16}, {0, 64}, {200, 1}}, 1700);
  run_case(kTinyDims, {{0, 1100}}, 1800);
  run_case(kV3Dims, {{300, 700}, {20, 1}}, 1900);
  run_case(kV3Dims, {{0, 200}, {150, 64}, {10, 1}, {1000, 100}}, 2000);
}

// DSINFER_MLA_FLASH_WGMMA=0: DeepSeek's head widths in the fused kernel's mma.sync form instead
// of its warpgroup form (the default for them, which the cases above run).
TEST_F(CudaAttentionTest, ExpandedChunksOnMmaSyncProducts) {
  gpu_ = make_backend_with_env("cuda", "DSINFER_MLA_FLASH_WGMMA", "0");
  run_case(kV3Dims, {{0, 5}, {64, 70}, {10, 1}}, 2200);
  run_case(kV3Dims, {{300, 700}, {20, 1}}, 2300);
}

// Queries made by mla_queries: in a batch all in the expanded form the CUDA backend keeps them in
// bf16 only, rotated by the attention; otherwise (a decode token beside the chunk, head widths
// that the fused kernel pads) they are the fp32 rows of linear.
TEST_F(CudaAttentionTest, QueriesKeptInBf16ForExpandedChunks) {
  const QueryProjection bf16_only{256, true}, fp32_rows{256, false};
  run_case(kV3Dims, {{0, 300}}, 2400, KvCacheFormat::kF32, nullptr, &bf16_only);
  run_case(kV3Dims, {{300, 700}, {0, 129}}, 2500, KvCacheFormat::kF32, nullptr, &bf16_only);
  run_case(kV3Dims, {{0, 200}, {150, 64}, {1000, 100}}, 2600, KvCacheFormat::kFp8, nullptr, &bf16_only);
  run_case(kV3Dims, {{300, 700}, {20, 1}}, 2700, KvCacheFormat::kF32, nullptr, &fp32_rows);
  run_case(kTinyDims, {{0, 300}}, 2800, KvCacheFormat::kF32, nullptr, &fp32_rows);
}

TEST_F(CudaAttentionTest, HeadWidthsTheExpandedFormCannotAlignStayAbsorbed) {
  run_case({2, 32, 16, 24, 18}, {{0, 70}, {5, 1}}, 1300);  // v_head_dim 18: fp32 rows off 16 bytes
}

}  // namespace
}  // namespace dsinfer
