#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_matmul.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace dsinfer {

namespace {

// "D,E" or "D,E,T,M" of DSINFER_CPU_FP8_ACTIVATIONS: row counts of 1 or more, T from 1 to 3, M at
// least D.
CpuBackend::Fp8Activations parse_fp8_activations(const char* value) {
  long long dense = 0, routed = 0, terms = 1, terms_max_rows = 0;
  int consumed = 0;
  const int two = std::sscanf(value, "%lld,%lld%n", &dense, &routed, &consumed);
  bool ok = two == 2 && dense >= 1 && routed >= 1;
  if (ok && value[consumed] == ',') {
    int more = 0;
    ok = std::sscanf(value + consumed, ",%lld,%lld%n", &terms, &terms_max_rows, &more) == 2 && terms >= 1 &&
         terms <= 3 && terms_max_rows >= dense;
    consumed += more;
  }
  if (!ok || value[consumed] != '\0') {
    throw Error(std::string("DSINFER_CPU_FP8_ACTIVATIONS: '") + value +
                "' is not D,E or D,E,T,M (the dense products' and routed experts' smallest steps, each 1 or more; "
                "the dense products' e4m3 terms, 1 to 3, up to steps of M rows, at least D)");
  }
  return {dense, routed, static_cast<int>(terms), terms_max_rows};
}

// "routed,e4m3,W,..." of DSINFER_CPU_ONE_ROW_BF16: `routed`, `e4m3` and input widths of 1 or more,
// comma-separated.
CpuOneRowBf16 parse_one_row_bf16(const char* value) {
  CpuOneRowBf16 kept;
  const std::string text = value;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    long long width = 0;
    int consumed = 0;
    if (item == "routed") {
      kept.routed_experts = true;
    } else if (item == "e4m3") {
      kept.e4m3_weights = true;
    } else if (std::sscanf(item.c_str(), "%lld%n", &width, &consumed) == 1 &&
               consumed == static_cast<int>(item.size()) && width >= 1) {
      kept.input_widths.push_back(width);
    } else {
      throw Error(std::string("DSINFER_CPU_ONE_ROW_BF16: '") + value + "': '" + item +
                  "' is not `routed`, `e4m3` or an input width of 1 or more");
    }
    if (end == text.size()) return kept;
    begin = end + 1;
  }
}

// A switch that is fp32 (the default) or `rounded` (bf16, tf32).
bool parse_rounding_switch(const char* name, const char* rounded) {
  const char* value = std::getenv(name);
  if (value == nullptr || std::strcmp(value, "fp32") == 0) return false;
  if (std::strcmp(value, rounded) == 0) return true;
  throw Error(std::string(name) + ": '" + value + "' is not fp32 or " + rounded);
}

// DeepSeek's FP8 activations: each 128-column tile of each row in e4m3 under the tile's scale,
// returned as the values the product reads (code x scale).
void quantize_rows_e4m3(const float* x, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
      const int64_t c1 = std::min(cols, c0 + 128);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::abs(x[r * cols + c]));
      const float scale = e4m3_block_scale(amax);
      for (int64_t c = c0; c < c1; ++c)
        out[r * cols + c] = fp8e4m3_to_f32(f32_to_fp8e4m3(x[r * cols + c] / scale)) * scale;
    }
  }
}

// x rounded to bf16 in `terms` e4m3 terms, added: the recipe's rows, then the recipe's rows of
// what the terms before leave (some four significant bits a term).
void quantize_rows_e4m3_terms(const float* x, int64_t rows, int64_t cols, int terms, float* out) {
  const size_t n = static_cast<size_t>(rows * cols);
  std::vector<float> left(n), term(n);
  for (size_t i = 0; i < n; ++i) {
    left[i] = round_to_bf16(x[i]);
    out[i] = 0.0f;
  }
  for (int t = 0; t < terms; ++t) {
    quantize_rows_e4m3(left.data(), rows, cols, term.data());
    for (size_t i = 0; i < n; ++i) {
      out[i] += term[i];
      left[i] -= term[i];
    }
  }
}

}  // namespace

CpuBackend::CpuBackend() {
  if (const char* fp8 = std::getenv("DSINFER_CPU_FP8_ACTIVATIONS"))
    roundings_.fp8_activations = parse_fp8_activations(fp8);
  roundings_.bf16_expanded_attention = parse_rounding_switch("DSINFER_CPU_EXPANDED_ATTENTION", "bf16");
  roundings_.bf16_query_tiles = parse_rounding_switch("DSINFER_CPU_QUERY_TILES", "bf16");
  roundings_.tf32_head_tiles = parse_rounding_switch("DSINFER_CPU_HEAD_TILES", "tf32");
  const char* inputs = std::getenv("DSINFER_CPU_PRODUCT_INPUTS");
  ProductInputs& mode = roundings_.product_inputs;
  if (inputs == nullptr || std::strcmp(inputs, "fp32") == 0) mode = ProductInputs::kFp32;
  else if (std::strcmp(inputs, "bf16") == 0) mode = ProductInputs::kBf16;
  else if (std::strcmp(inputs, "bf16-multirow") == 0) mode = ProductInputs::kBf16MultiRow;
  else if (std::strcmp(inputs, "f16") == 0) mode = ProductInputs::kF16;
  else if (std::strcmp(inputs, "f16-multirow") == 0) mode = ProductInputs::kF16MultiRow;
  else if (std::strcmp(inputs, "f16-pairs") == 0) mode = ProductInputs::kF16Pairs;
  else throw Error(std::string("DSINFER_CPU_PRODUCT_INPUTS: '") + inputs +
                   "' is not fp32, bf16, bf16-multirow, f16, f16-multirow or f16-pairs");
  if (const char* kept = std::getenv("DSINFER_CPU_ONE_ROW_BF16")) {
    // Elsewhere it would do nothing, silently.
    if (mode != ProductInputs::kBf16MultiRow)
      throw Error("DSINFER_CPU_ONE_ROW_BF16 applies with DSINFER_CPU_PRODUCT_INPUTS=bf16-multirow only");
    roundings_.one_row_bf16 = parse_one_row_bf16(kept);
  }
}

bool CpuOneRowBf16::takes(int64_t input_width, bool routed_expert, bool e4m3_weight) const {
  if (e4m3_weight && e4m3_weights) return true;
  if (routed_expert) return routed_experts;
  return std::find(input_widths.begin(), input_widths.end(), input_width) != input_widths.end();
}

Tensor CpuBackend::empty(const std::vector<int64_t>& shape, DType dtype) {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  const size_t bytes = std::max<size_t>(64, (t.num_bytes() + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, bytes);
  DS_CHECK_MSG(p != nullptr, "out of host memory allocating " << bytes << " bytes");
  t.storage = std::shared_ptr<void>(p, std::free);
  t.data = p;
  return t;
}

Tensor CpuBackend::from_host(const HostTensor& host) {
  const int64_t n = num_elements(host.shape);
  if (host.dtype == DType::kI32 || host.dtype == DType::kI64) {
    Tensor t = empty(host.shape, host.dtype);
    std::memcpy(t.data, host.data, t.num_bytes());
    return t;
  }
  Tensor t = empty(host.shape, DType::kF32);
  convert_to_f32(host.dtype, host.data, t.as<float>(), n);
  if (host.dtype == DType::kF8E4M3 && host.scale_inv != nullptr) {
    DS_CHECK(host.shape.size() == 2);
    const int64_t rows = host.shape[0], cols = host.shape[1];
    const int64_t num_col_blocks = (cols + host.block_cols - 1) / host.block_cols;
    float* w = t.as<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const float* scales = host.scale_inv + (r / host.block_rows) * num_col_blocks;
      for (int64_t c = 0; c < cols; ++c) w[r * cols + c] *= scales[c / host.block_cols];
    }
  }
  return t;
}

void CpuBackend::penalise_logits(Tensor& logits, std::span<const LogitPenalty> penalties) {
  check_logit_penalties(logits, penalties);
  const int64_t vocab = logits.dim(1);
  float* values = logits.as<float>();
  for (const LogitPenalty& p : penalties) {
    float& v = values[p.row * vocab + p.token];
    v = penalised_logit(v, p.repetition, p.subtract);
  }
}

void CpuBackend::to_host(const Tensor& t, float* dst) {
  DS_CHECK(t.dtype == DType::kF32);
  std::memcpy(dst, t.data, t.num_bytes());
}

LinearWeight CpuBackend::make_linear(const HostTensor& w) {
  DS_CHECK(w.shape.size() == 2);
  LinearWeight lw;
  lw.out_features = w.shape[0];
  lw.in_features = w.shape[1];
  lw.weight = from_host(w);
  if (w.dtype == DType::kF8E4M3) {
    e4m3_weights_[lw.weight.data] = lw.weight.storage;
  } else if (roundings_.bf16_routed_expert_weights && w.routed_expert) {
    float* values = lw.weight.as<float>();
    for (int64_t i = 0; i < lw.weight.num_elements(); ++i) values[i] = round_to_bf16(values[i]);
  }
  return lw;
}

bool CpuBackend::is_e4m3(const LinearWeight& w) const {
  const auto it = e4m3_weights_.find(w.weight.data);
  return it != e4m3_weights_.end() && !it->second.expired();
}

void CpuBackend::embedding(const Tensor& table, std::span<const TokenId> ids, Tensor& out) {
  const int64_t hidden = table.dim(1);
  const int64_t vocab = table.dim(0);
  for (size_t i = 0; i < ids.size(); ++i) {
    DS_CHECK_MSG(ids[i] >= 0 && ids[i] < vocab, "token id " << ids[i] << " outside vocab " << vocab);
    std::memcpy(out.as<float>() + i * hidden, table.as<float>() + ids[i] * hidden, hidden * 4);
  }
}

namespace cpu {
void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* out) {
  double sum_sq = 0.0;  // the row's mean square in double: the reference wants fp32 or better
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}
}  // namespace cpu

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  const int64_t rows = x.dim(0), n = x.dim(1);
  global_thread_pool().parallel_for(rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      cpu::rms_norm_row(x.as<float>() + r * n, w.as<float>(), n, eps, out.as<float>() + r * n);
  }, 8);
}

void CpuBackend::add(Tensor& x, const Tensor& y) {
  const int64_t n = x.num_elements();
  DS_CHECK(y.num_elements() == n);
  float* a = x.as<float>();
  const float* b = y.as<float>();
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

namespace {

// y = w · x for one row x (already rounded to f16), summed as a few-row walk sums f16 pairs:
// each 8 columns in two chains (even and odd columns) of four f16 products, every step rounded
// to f16, then the two chains' sums added in fp32. The weights are used as they are: bf16 and
// f16 ones are f16 values already, and an e4m3 walk multiplies the codes (exact in f16) and
// applies the block's scale after, which rounds like the dequantised values do, but for f16's
// range.
void matvec_f16_pairs(const float* x, int64_t k, const float* w, int64_t n, float* y) {
  global_thread_pool().parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const float* wo = w + o * k;
      float sum = 0.0f;
      for (int64_t c0 = 0; c0 < k; c0 += 8) {
        float chain[2] = {0.0f, 0.0f};
        for (int64_t c = c0; c < std::min(c0 + 8, k); ++c) {
          chain[c % 2] = round_to_f16(std::fma(wo[c], x[c], chain[c % 2]));
        }
        sum += chain[0] + chain[1];
      }
      y[o] = sum;
    }
  }, 1);
}

}  // namespace

void CpuBackend::linear(const Tensor& x, const LinearWeight& w, Tensor& out) {
  linear_in_step(x, w, out, x.dim(0));
}

void CpuBackend::linear_in_step(const Tensor& x, const LinearWeight& w, Tensor& out, int64_t step_rows,
                                bool routed_expert) {
  DS_CHECK_MSG(x.dim(1) == w.in_features, "linear: input width " << x.dim(1) << " vs " << w.in_features);
  const int64_t rows = x.dim(0);
  const CpuFp8Activations& fp8 = roundings_.fp8_activations;
  const int64_t fp8_min_rows = routed_expert ? fp8.routed_min_rows : fp8.dense_min_rows;
  // Routed experts take the terms in the steps where the dense products take them.
  const bool terms_step = fp8.dense_terms > 1 && step_rows <= fp8.dense_terms_max_rows;
  if (fp8_min_rows > 0 && step_rows >= fp8_min_rows && is_e4m3(w)) {
    std::vector<float> quantized(static_cast<size_t>(rows * w.in_features));
    if (terms_step)
      quantize_rows_e4m3_terms(x.as<float>(), rows, w.in_features, fp8.dense_terms, quantized.data());
    else
      quantize_rows_e4m3(x.as<float>(), rows, w.in_features, quantized.data());
    cpu::matmul_xwt(quantized.data(), rows, w.in_features, w.weight.as<float>(), w.out_features, out.as<float>());
    return;
  }
  const ProductInputs mode = roundings_.product_inputs;
  const bool e4m3_pairs = roundings_.one_row_e4m3_f16_pairs && step_rows == 1 && is_e4m3(w);
  const bool to_bf16 =
      !e4m3_pairs &&
      (mode == ProductInputs::kBf16 ||
       (mode == ProductInputs::kBf16MultiRow &&
        (step_rows > 1 || roundings_.one_row_bf16.takes(w.in_features, routed_expert, is_e4m3(w)))));
  const bool to_f16 = mode == ProductInputs::kF16 || mode == ProductInputs::kF16Pairs ||
                      (mode == ProductInputs::kF16MultiRow && step_rows > 1) || e4m3_pairs;
  const float* xs = x.as<float>();
  std::vector<float> rounded;
  if (to_bf16 || to_f16) {
    rounded.resize(static_cast<size_t>(rows * w.in_features));
    for (size_t i = 0; i < rounded.size(); ++i) {
      rounded[i] = to_bf16 ? round_to_bf16(xs[i]) : round_to_f16(xs[i]);
    }
    xs = rounded.data();
  }
  if ((mode == ProductInputs::kF16Pairs || e4m3_pairs) && rows == 1) {
    matvec_f16_pairs(xs, w.in_features, w.weight.as<float>(), w.out_features, out.as<float>());
  } else {
    cpu::matmul_xwt(xs, rows, w.in_features, w.weight.as<float>(), w.out_features, out.as<float>());
  }
}

void CpuBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  const int64_t rows = gate_up.dim(0), inter = gate_up.dim(1) / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up.as<float>() + r * 2 * inter;
    const float* u = g + inter;
    float* o = out.as<float>() + r * inter;
    for (int64_t i = 0; i < inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void CpuBackend::concat_cols(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t rows = a.dim(0), na = a.dim(1), nb = b.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(out.as<float>() + r * (na + nb), a.as<float>() + r * na, na * 4);
    std::memcpy(out.as<float>() + r * (na + nb) + na, b.as<float>() + r * nb, nb * 4);
  }
}

void CpuBackend::gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) {
  const int64_t n = x.dim(1);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.as<float>() + i * n, x.as<float>() + static_cast<int64_t>(rows[i]) * n, n * 4);
}

void CpuBackend::read_cache_block(const LayerKvCache& cache, int32_t block, void* dst) {
  const size_t block_bytes = cache.data.num_bytes() / static_cast<size_t>(cache.data.dim(0));
  std::memcpy(dst, static_cast<const uint8_t*>(cache.data.data) + block * block_bytes, block_bytes);
}

void CpuBackend::write_cache_block(LayerKvCache& cache, int32_t block, const void* src) {
  const size_t block_bytes = cache.data.num_bytes() / static_cast<size_t>(cache.data.dim(0));
  std::memcpy(static_cast<uint8_t*>(cache.data.data) + block * block_bytes, src, block_bytes);
}

}  // namespace dsinfer
