// Byte-level BPE: merges applied to a piece's bytes directly (each byte starts as the vocab
// token of its ByteLevel character), lowest merge rank first, leftmost on ties — the order
// HF tokenizers and transformers.js use. A bounded cache keeps the ids of frequent pieces.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dsinfer::tok {

class BpeModel {
 public:
  struct Merge {
    int32_t left = 0;
    int32_t right = 0;
    int32_t merged = 0;
  };

  // byte_ids[b] is the vocab id of byte b's ByteLevel token; merges are in rank order (a
  // later duplicate of a pair replaces the earlier one, as in HF tokenizers).
  BpeModel(const int32_t (&byte_ids)[256], const std::vector<Merge>& merges);
  ~BpeModel();

  // Appends the ids of one pre-tokenized piece. Thread-safe.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  // The merge loop without the cache; use_heap picks the O(n log n) variant that long
  // pieces use (both give the same ids; exposed for tests).
  void merge_bytes(std::string_view piece, bool use_heap, std::vector<int32_t>& out) const;

  int num_merges() const { return num_merges_; }

 private:
  struct MergeEntry {
    uint64_t key = kEmpty;  // left << 32 | right
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~0ull;

  const MergeEntry* find_merge(int32_t left, int32_t right) const {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = static_cast<size_t>(h >> shift_);
    for (;;) {
      const MergeEntry& e = table_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }
  void merge_small(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_heap(std::string_view piece, std::vector<int32_t>& out) const;

  int32_t byte_ids_[256];
  std::vector<MergeEntry> table_;  // open addressing, power-of-two size
  size_t mask_ = 0;
  int shift_ = 0;
  int num_merges_ = 0;

  // The piece cache: sharded so that parallel encoders rarely contend; a shard that fills
  // up is cleared (frequent pieces come back at once).
  static constexpr int kNumCacheShards = 64;
  static constexpr size_t kMaxCachedPieceBytes = 64;
  static constexpr size_t kMaxEntriesPerShard = 4096;
  struct PieceHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, PieceHash, std::equal_to<>> map;
  };
  std::unique_ptr<CacheShard[]> cache_;
};

}  // namespace dsinfer::tok
