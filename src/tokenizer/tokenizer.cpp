#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/special_token_matcher.h"
#include "tokenizer/utf8.h"

namespace dsinfer {
namespace {

constexpr uint8_t kAdded = 1;
constexpr uint8_t kSpecial = 2;

// GPT-2's ByteLevel alphabet: printable Latin-1 bytes stand for themselves, the others are
// shifted to U+0100.. in byte order.
struct ByteLevelAlphabet {
  static constexpr uint32_t kMaxCp = 0x144;  // the alphabet's code points are all below this
  uint32_t byte_to_cp[256];
  int16_t cp_to_byte[kMaxCp];  // -1: not in the alphabet
  ByteLevelAlphabet() {
    std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), static_cast<int16_t>(-1));
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_cp[b] = printable ? b : 256 + extra++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelAlphabet& alphabet() {
  static const ByteLevelAlphabet a;
  return a;
}

// The raw bytes a ByteLevel token string stands for; nullopt if a character is outside the
// alphabet (then the token is not a byte-level token).
std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  const auto& a = alphabet();
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    if (tok::utf8_valid_sequence_length(token.substr(i)) == 0) return std::nullopt;
    const uint32_t cp = tok::decode_utf8(token, &i);
    if (cp >= ByteLevelAlphabet::kMaxCp || a.cp_to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(a.cp_to_byte[cp]));
  }
  return out;
}

std::string byte_to_level_string(uint8_t b) {
  std::string s;
  tok::append_utf8(alphabet().byte_to_cp[b], s);
  return s;
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(StatusCode::kNotFound, "cannot open " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(StatusCode::kDataLoss, path.string() + ": invalid JSON: " + e.what());
  }
}

// bos_token / eos_token are either a string or an AddedToken object with "content".
std::string token_content(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const auto tok_path = dir / "tokenizer.json";
  const auto cfg_path = dir / "tokenizer_config.json";
  const nlohmann::json tok_json = read_json_file(tok_path);
  nlohmann::json cfg_json;
  if (std::filesystem::exists(cfg_path)) cfg_json = read_json_file(cfg_path);
  try {
    return from_json(tok_json, cfg_json, tok_path.string());
  } catch (const nlohmann::json::exception& e) {
    throw Error(StatusCode::kDataLoss, tok_path.string() + " / " + cfg_path.string() + ": " + e.what());
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(const nlohmann::json& tj, const nlohmann::json& config,
                                                const std::string& origin) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  auto fail = [&](const std::string& what) { throw Error(StatusCode::kDataLoss, origin + ": " + what); };
  if (!tj.is_object() || !tj.contains("model")) fail("no \"model\"");
  const auto& model = tj.at("model");
  if (model.value("type", "BPE") != "BPE") fail("model.type is not BPE");
  if (!model.contains("vocab") || !model["vocab"].is_object()) fail("model.vocab is missing");
  if (model.value("byte_fallback", false)) fail("byte_fallback BPE is not supported");
  const auto& normalizer = tj.value("normalizer", nlohmann::json());
  if (normalizer.is_object()) {
    const bool empty_sequence = normalizer.value("type", "") == "Sequence" && normalizer.contains("normalizers") &&
                                normalizer["normalizers"].empty();
    if (!empty_sequence) fail("normalizers are not supported");
  }

  // Vocab.
  int32_t max_id = -1;
  t->vocab_.reserve(model["vocab"].size() * 2);
  for (const auto& [token, idv] : model["vocab"].items()) {
    if (!idv.is_number_integer()) fail("model.vocab[\"" + token + "\"] is not an integer");
    const auto id = idv.get<int64_t>();
    if (id < 0 || id > (1 << 24)) fail("model.vocab id out of range: " + std::to_string(id));
    t->vocab_.emplace(token, static_cast<int32_t>(id));
    max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
  }
  std::vector<nlohmann::json> added_list;
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
    for (const auto& a : tj["added_tokens"]) {
      if (!a.contains("id") || !a.contains("content")) fail("added_tokens entry without id/content");
      const auto id = a["id"].get<int64_t>();
      if (id < 0 || id > (1 << 24)) fail("added token id out of range");
      max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
      added_list.push_back(a);
    }
  }
  t->id_to_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  t->id_flags_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [token, id] : t->vocab_) {
    auto bytes = byte_level_to_bytes(token);
    t->id_to_bytes_[id] = bytes ? *bytes : token;
  }
  t->added_matcher_ = std::make_unique<tok::SpecialTokenMatcher>();
  for (const auto& a : added_list) {
    const auto id = a["id"].get<int32_t>();
    const std::string content = a["content"].get<std::string>();
    t->id_to_bytes_[id] = content;
    t->id_flags_[id] = kAdded | (a.value("special", false) ? kSpecial : 0);
    t->added_.emplace(content, id);
    t->added_matcher_->add(content, id);
  }

  // ByteLevel byte tokens and merges.
  int32_t byte_ids[256];
  for (int b = 0; b < 256; ++b) {
    auto it = t->vocab_.find(byte_to_level_string(static_cast<uint8_t>(b)));
    if (it == t->vocab_.end()) fail("model.vocab lacks the ByteLevel token of byte " + std::to_string(b));
    byte_ids[b] = it->second;
  }
  std::vector<tok::BpeModel::Merge> merges;
  if (model.contains("merges")) {
    const auto& ml = model["merges"];
    merges.reserve(ml.size());
    std::string left, right, joined;
    for (const auto& m : ml) {
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) fail("bad merge \"" + s + "\"");
        left.assign(s, 0, sp);
        right.assign(s, sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get_ref<const std::string&>();
        right = m[1].get_ref<const std::string&>();
      } else {
        fail("bad merge entry");
      }
      joined.assign(left).append(right);
      auto l = t->vocab_.find(left), r = t->vocab_.find(right), lr = t->vocab_.find(joined);
      if (l == t->vocab_.end() || r == t->vocab_.end() || lr == t->vocab_.end())
        fail("merge \"" + left + " " + right + "\" uses a token missing from the vocab");
      merges.push_back({l->second, r->second, lr->second});
    }
  }
  t->bpe_ = std::make_unique<tok::BpeModel>(byte_ids, merges);
  t->pre_tokenizer_ = std::make_unique<tok::PreTokenizer>(tj.value("pre_tokenizer", nlohmann::json()));

  // tokenizer_config.json.
  if (config.is_object()) {
    if (config.contains("bos_token")) t->bos_token_ = token_content(config["bos_token"]);
    if (config.contains("eos_token")) t->eos_token_ = token_content(config["eos_token"]);
    if (config.contains("chat_template")) {
      const auto& ct = config["chat_template"];
      if (ct.is_string()) {
        t->chat_template_ = ct.get<std::string>();
      } else if (ct.is_array()) {
        // The named-template form: take "default".
        for (const auto& e : ct)
          if (e.value("name", "") == "default") t->chat_template_ = e.value("template", "");
      }
    }
  }
  if (!t->bos_token_.empty()) t->bos_id_ = t->token_to_id(t->bos_token_);
  if (!t->eos_token_.empty()) t->eos_id_ = t->token_to_id(t->eos_token_);
  return t;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (auto it = added_.find(key); it != added_.end()) return it->second;
  if (auto it = vocab_.find(key); it != vocab_.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && (id_flags_[id] & kSpecial);
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < vocab_size() && (id_flags_[id] & kAdded);
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return id_to_bytes_[id];
}

void Tokenizer::set_num_threads(int num_threads) {
  num_threads_ = num_threads;
}

ThreadPool* Tokenizer::pool() const {
  if (num_threads_ == 1) return nullptr;
  std::call_once(pool_once_, [&] { pool_ = std::make_unique<ThreadPool>(num_threads_); });
  return pool_->num_threads() > 1 ? pool_.get() : nullptr;
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<tok::Span> pieces;
  size_t i = 0;
  while (i < text.size()) {
    // PCRE2 needs valid UTF-8: split the text into valid runs; each invalid byte is a piece of
    // its own, so that every input still round-trips through byte tokens.
    const std::string_view rest = text.substr(i);
    const size_t valid = tok::utf8_valid_prefix_length(rest);
    if (valid > 0) {
      const std::string_view run = rest.substr(0, valid);
      pieces.clear();
      pre_tokenizer_->split(run, pieces);
      for (const auto& p : pieces) bpe_->encode_piece(run.substr(p.begin, p.length), out);
      i += valid;
    } else {
      bpe_->encode_piece(rest.substr(0, 1), out);
      i += 1;
    }
  }
}

size_t Tokenizer::find_safe_cut(std::string_view text, size_t from, size_t max_scan_bytes) {
  // Two kinds of cut keep the DeepSeek / GPT-style Split regexes' pieces intact (no piece
  // crosses them and no lookahead reaches over them):
  //  - after '\n' when the next byte is printable, non-space ASCII: every alternative that
  //    can contain a newline ends with a run of newlines or whitespace, which stops there;
  //  - at ' ' between two ASCII letters: the word to the left ends there, and " word"
  //    starts there whichever side it is encoded from.
  // A long text without either is left in one piece.
  const size_t end = std::min(text.size(), from + max_scan_bytes);
  auto is_letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  size_t space_cut = std::string_view::npos;
  for (size_t p = std::max<size_t>(from, 1); p + 1 < end; ++p) {
    const char c = text[p];
    if (text[p - 1] == '\n' && c > 0x20 && c < 0x7F) return p;
    if (space_cut == std::string_view::npos && c == ' ' && is_letter(text[p - 1]) && is_letter(text[p + 1]))
      space_cut = p;
  }
  return space_cut;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  return encode_impl(text, allow_special, text.size() >= parallel_min_bytes_);
}

std::vector<int32_t> Tokenizer::encode_sequential(std::string_view text, bool allow_special) const {
  return encode_impl(text, allow_special, false);
}

std::vector<int32_t> Tokenizer::encode_impl(std::string_view text, bool allow_special, bool parallel) const {
  // Segments: runs of plain text and added tokens, in order.
  struct Segment {
    size_t begin = 0;
    size_t length = 0;
    int32_t token = -1;  // >= 0: an added token
  };
  std::vector<Segment> segments;
  {
    std::vector<tok::SpecialTokenMatcher::Match> matches;
    if (allow_special) added_matcher_->find_all(text, matches);
    size_t prev = 0;
    for (const auto& m : matches) {
      if (m.begin > prev) segments.push_back({prev, m.begin - prev, -1});
      segments.push_back({m.begin, m.length, m.id});
      prev = m.begin + m.length;
    }
    if (prev < text.size()) segments.push_back({prev, text.size() - prev, -1});
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  ThreadPool* tp = parallel ? pool() : nullptr;
  if (tp == nullptr) {
    for (const auto& s : segments) {
      if (s.token >= 0) {
        out.push_back(s.token);
      } else {
        encode_plain(text.substr(s.begin, s.length), out);
      }
    }
    return out;
  }
  // Cut long plain segments into chunks of about kChunkBytes at safe cuts; encode every
  // chunk on the pool into its own vector, then concatenate in order.
  constexpr size_t kChunkBytes = 16 * 1024;
  constexpr size_t kMaxScanBytes = 8 * 1024;
  std::vector<Segment> tasks;
  for (const auto& s : segments) {
    if (s.token >= 0) {
      tasks.push_back(s);
      continue;
    }
    const std::string_view body = text.substr(s.begin, s.length);
    size_t start = 0;
    while (body.size() - start > 2 * kChunkBytes) {
      const size_t cut = find_safe_cut(body, start + kChunkBytes, kMaxScanBytes);
      if (cut == std::string_view::npos) {
        // No cut near the target: look again further on.
        const size_t next_try = start + kChunkBytes + kMaxScanBytes;
        const size_t cut2 = find_safe_cut(body, next_try, body.size());
        if (cut2 == std::string_view::npos || cut2 >= body.size()) break;
        tasks.push_back({s.begin + start, cut2 - start, -1});
        start = cut2;
        continue;
      }
      tasks.push_back({s.begin + start, cut - start, -1});
      start = cut;
    }
    tasks.push_back({s.begin + start, body.size() - start, -1});
  }
  std::vector<std::vector<int32_t>> results(tasks.size());
  tp->parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const Segment& s = tasks[k];
      if (s.token >= 0) {
        results[k].push_back(s.token);
      } else {
        encode_plain(text.substr(s.begin, s.length), results[k]);
      }
    }
  });
  for (const auto& r : results) out.insert(out.end(), r.begin(), r.end());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string raw;
  raw.reserve(ids.size() * 4);
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && (id_flags_[id] & kSpecial)) continue;
    raw += id_to_bytes_[id];
  }
  return tok::utf8_lossy(raw);
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text) const {
  std::vector<int32_t> ids = encode(text, /*allow_special=*/true);
  if (bos_id_ && (ids.empty() || ids.front() != *bos_id_)) ids.insert(ids.begin(), *bos_id_);
  return ids;
}

}  // namespace dsinfer
