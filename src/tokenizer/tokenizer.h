// The tokenizer of a DeepSeek model directory: byte-level BPE from HF tokenizer.json, with
// added/special tokens, the Split/ByteLevel pre-tokenizer and the ByteLevel decoder, plus the
// bos/eos tokens and chat template of tokenizer_config.json.
//
// Encoding: one pass finds added tokens; the text between them is pre-tokenized and BPE
// encoded, in parallel chunks for long texts (cut only where the pre-tokenizer provably cuts
// too, so the ids equal the sequential encoder's), with a cache of frequent pieces.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsinfer {
class ThreadPool;
}

namespace dsinfer::tok {
class BpeModel;
class PreTokenizer;
class SpecialTokenMatcher;
}  // namespace dsinfer::tok

namespace dsinfer {

class Tokenizer {
 public:
  // Reads model_dir/tokenizer.json and model_dir/tokenizer_config.json. Throws
  // dsinfer::Error naming the file (and field) on missing or malformed input.
  static std::unique_ptr<Tokenizer> load(const std::string& model_dir);
  // The same from parsed JSON (config may be null); `origin` names the source in errors.
  static std::unique_ptr<Tokenizer> from_json(const nlohmann::json& tokenizer_json, const nlohmann::json& config,
                                              const std::string& origin = "tokenizer.json");
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of text. With allow_special, the text of an added token (special or not, e.g.
  // "<｜User｜>") becomes that token; without it such text is encoded as plain text, so user
  // input cannot forge control tokens. No BOS is added. Never fails: bytes that are not valid
  // UTF-8 are encoded as their own byte tokens. Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;
  // A completion prompt: encode (special tokens allowed) and start with BOS, as the DeepSeek
  // tokenizers' add_bos_token asks, unless the text already begins with it.
  std::vector<int32_t> encode_prompt(std::string_view text) const;
  // The single-threaded reference path (same ids as encode()); for tests and benchmarks.
  std::vector<int32_t> encode_sequential(std::string_view text, bool allow_special = true) const;

  // Text of ids. Added tokens are written as their content (special ones left out with
  // skip_special); bytes that do not form valid UTF-8 become U+FFFD; unknown ids are skipped.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The raw bytes of one token (its content for added tokens, empty for unknown ids).
  std::string_view token_bytes(int32_t id) const;

  // Number of ids (largest id + 1).
  int vocab_size() const { return static_cast<int>(id_to_bytes_.size()); }
  // Id of an added token's content, or of a vocab token in its tokenizer.json (ByteLevel) form.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;

  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  const std::string& chat_template() const { return chat_template_; }

  // Threads used by encode() for long texts (default: the machine's cores; 1 disables them).
  // Takes effect only before the first parallel encode, which creates the pool.
  void set_num_threads(int num_threads);
  // Texts shorter than this many bytes are encoded on the calling thread.
  void set_parallel_min_bytes(size_t bytes) { parallel_min_bytes_ = bytes; }

  // Where a long run of plain text can be cut so that pre-tokenizing the two halves gives
  // exactly the pieces of the whole: the first safe cut at or after `from`, or npos.
  static size_t find_safe_cut(std::string_view text, size_t from, size_t max_scan_bytes);

 private:
  Tokenizer();
  // Encodes text that contains no added tokens (or where they are not honoured).
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode_impl(std::string_view text, bool allow_special, bool parallel) const;
  ThreadPool* pool() const;

  std::unique_ptr<tok::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tok::BpeModel> bpe_;
  std::unique_ptr<tok::SpecialTokenMatcher> added_matcher_;
  std::vector<std::string> id_to_bytes_;   // raw bytes of every id ("" for holes)
  std::vector<uint8_t> id_flags_;          // kAdded | kSpecial
  std::unordered_map<std::string, int32_t> vocab_;        // ByteLevel form → id
  std::unordered_map<std::string, int32_t> added_;        // content → id
  std::optional<int32_t> bos_id_, eos_id_;
  std::string bos_token_, eos_token_, chat_template_;
  int num_threads_ = 0;
  size_t parallel_min_bytes_ = 64 * 1024;
  mutable std::unique_ptr<ThreadPool> pool_;
  mutable std::once_flag pool_once_;
};

}  // namespace dsinfer
