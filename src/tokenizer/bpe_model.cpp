#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <functional>
#include <queue>

#include "core/check.h"

namespace dsinfer::tok {
namespace {
// Pieces up to this many bytes use the quadratic scan, which beats a heap on short words.
constexpr size_t kSmallPieceBytes = 48;
}  // namespace

BpeModel::BpeModel(const int32_t (&byte_ids)[256], const std::vector<Merge>& merges) : cache_(new CacheShard[kNumCacheShards]) {
  std::copy(std::begin(byte_ids), std::end(byte_ids), byte_ids_);
  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  table_.assign(cap, MergeEntry{});
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
  for (size_t r = 0; r < merges.size(); ++r) {
    const Merge& m = merges[r];
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(m.left)) << 32) | static_cast<uint32_t>(m.right);
    size_t i = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
    while (table_[i].key != kEmpty && table_[i].key != key) i = (i + 1) & mask_;
    if (table_[i].key == kEmpty) ++num_merges_;
    table_[i] = {key, static_cast<int32_t>(r), m.merged};
  }
}

BpeModel::~BpeModel() = default;

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (piece.empty()) return;
  if (piece.size() > kMaxCachedPieceBytes) {
    merge_bytes(piece, piece.size() > kSmallPieceBytes, out);
    return;
  }
  CacheShard& shard = cache_[(std::hash<std::string_view>{}(piece) >> 7) % kNumCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(piece);
    if (it != shard.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  merge_bytes(piece, false, out);
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() >= kMaxEntriesPerShard) shard.map.clear();
  shard.map.emplace(std::string(piece), std::vector<int32_t>(out.begin() + start, out.end()));
}

void BpeModel::merge_bytes(std::string_view piece, bool use_heap, std::vector<int32_t>& out) const {
  if (use_heap) {
    merge_heap(piece, out);
  } else {
    merge_small(piece, out);
  }
}

void BpeModel::merge_small(std::string_view piece, std::vector<int32_t>& out) const {
  // Symbols live in a small array; each round finds the lowest-ranked adjacent pair (the
  // leftmost among equals) and merges it, until no pair has a merge.
  const size_t n = piece.size();
  int32_t stack_buf[kSmallPieceBytes];
  std::vector<int32_t> heap_buf;
  int32_t* sym = stack_buf;
  if (n > kSmallPieceBytes) {
    heap_buf.resize(n);
    sym = heap_buf.data();
  }
  for (size_t i = 0; i < n; ++i) sym[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
  size_t len = n;
  for (;;) {
    int32_t best_rank = INT32_MAX, best_merged = 0;
    size_t best_i = 0;
    for (size_t i = 0; i + 1 < len; ++i) {
      const MergeEntry* e = find_merge(sym[i], sym[i + 1]);
      if (e != nullptr && e->rank < best_rank) {
        best_rank = e->rank;
        best_merged = e->merged;
        best_i = i;
      }
    }
    if (best_rank == INT32_MAX) break;
    sym[best_i] = best_merged;
    for (size_t i = best_i + 1; i + 1 < len; ++i) sym[i] = sym[i + 1];
    --len;
  }
  out.insert(out.end(), sym, sym + len);
}

void BpeModel::merge_heap(std::string_view piece, std::vector<int32_t>& out) const {
  // A doubly linked list of symbols and a min-heap of candidate merges keyed by
  // (rank, position of the left symbol). Stale candidates are skipped when popped.
  const int n = static_cast<int>(piece.size());
  std::vector<int32_t> id(n);
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    id[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push_pair = [&](int left) {
    const int right = next[left];
    if (right < 0) return;
    if (const MergeEntry* e = find_merge(id[left], id[right])) heap.push({e->rank, left, e->merged});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    const int right = next[c.pos];
    const MergeEntry* e = find_merge(id[c.pos], id[right]);
    if (e == nullptr || e->merged != c.merged || e->rank != c.rank) continue;
    id[c.pos] = c.merged;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    if (prev[c.pos] >= 0) push_pair(prev[c.pos]);
    push_pair(c.pos);
  }
  for (int i = 0; i >= 0 && i < n; i = next[i]) out.push_back(id[i]);
}

}  // namespace dsinfer::tok
