#include "kv/store_object.h"

#include <bit>
#include <cstring>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "core/check.h"

namespace dsinfer::kv {
namespace {

static_assert(std::endian::native == std::endian::little, "the store format is little-endian");

constexpr char kMagic[8] = {'D', 'S', 'K', 'V', 'O', 'B', 'J', '1'};
constexpr size_t kChecksumOffset = 80;

template <typename T>
void put(std::vector<std::byte>& buf, size_t offset, T value) {
  std::memcpy(buf.data() + offset, &value, sizeof(T));
}

template <typename T>
T get(std::span<const std::byte> buf, size_t offset) {
  T value;
  std::memcpy(&value, buf.data() + offset, sizeof(T));
  return value;
}

uint64_t checksum(std::span<const std::byte> header, std::span<const std::byte> data) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  // The checksum field itself counts as zero.
  XXH3_64bits_update(&state, header.data(), kChecksumOffset);
  const uint64_t zero = 0;
  XXH3_64bits_update(&state, &zero, sizeof(zero));
  XXH3_64bits_update(&state, header.data() + kChecksumOffset + 8, header.size() - kChecksumOffset - 8);
  XXH3_64bits_update(&state, data.data(), data.size());
  return XXH3_64bits_digest(&state);
}

}  // namespace

const char* store_decode_status_name(StoreDecodeStatus status) {
  switch (status) {
    case StoreDecodeStatus::kOk: return "ok";
    case StoreDecodeStatus::kTruncated: return "truncated";
    case StoreDecodeStatus::kBadMagic: return "bad magic";
    case StoreDecodeStatus::kBadVersion: return "bad layout version";
    case StoreDecodeStatus::kBadChecksum: return "bad checksum";
    case StoreDecodeStatus::kForeign: return "foreign model identity";
    case StoreDecodeStatus::kKeyMismatch: return "key mismatch";
    case StoreDecodeStatus::kTokenMismatch: return "token mismatch";
  }
  return "unknown";
}

std::vector<std::byte> encode_store_header(const StoreObject& o) {
  const size_t header_bytes = kStoreFixedHeaderBytes + o.model_identity.size() + o.traffic_class.size() +
                              o.tokens.size() * sizeof(TokenId);
  std::vector<std::byte> h(header_bytes);
  std::memcpy(h.data(), kMagic, sizeof(kMagic));
  put<uint32_t>(h, 8, kStoreLayoutVersion);
  put<uint32_t>(h, 12, static_cast<uint32_t>(header_bytes));
  put<uint64_t>(h, 16, o.key.low);
  put<uint64_t>(h, 24, o.key.high);
  put<uint64_t>(h, 32, o.parent_key.low);
  put<uint64_t>(h, 40, o.parent_key.high);
  put<int64_t>(h, 48, o.created_ms);
  put<uint32_t>(h, 56, static_cast<uint32_t>(o.model_identity.size()));
  put<uint32_t>(h, 60, static_cast<uint32_t>(o.traffic_class.size()));
  put<uint32_t>(h, 64, static_cast<uint32_t>(o.tokens.size()));
  put<uint32_t>(h, 68, 0);
  put<uint64_t>(h, 72, o.data.size());
  size_t at = kStoreFixedHeaderBytes;
  std::memcpy(h.data() + at, o.model_identity.data(), o.model_identity.size());
  at += o.model_identity.size();
  std::memcpy(h.data() + at, o.traffic_class.data(), o.traffic_class.size());
  at += o.traffic_class.size();
  std::memcpy(h.data() + at, o.tokens.data(), o.tokens.size() * sizeof(TokenId));
  put<uint64_t>(h, kChecksumOffset, checksum(h, o.data));
  return h;
}

StoreDecodeStatus decode_store_object(std::span<const std::byte> file, const BlockHash& expected_key,
                                      const std::string& expected_identity,
                                      std::span<const TokenId> expected_tokens, StoreObject* out,
                                      size_t* data_offset) {
  if (file.size() < kStoreFixedHeaderBytes) return StoreDecodeStatus::kTruncated;
  if (std::memcmp(file.data(), kMagic, sizeof(kMagic)) != 0) return StoreDecodeStatus::kBadMagic;
  if (get<uint32_t>(file, 8) != kStoreLayoutVersion) return StoreDecodeStatus::kBadVersion;
  const uint64_t header_bytes = get<uint32_t>(file, 12);
  const uint64_t identity_bytes = get<uint32_t>(file, 56);
  const uint64_t class_bytes = get<uint32_t>(file, 60);
  const uint64_t num_tokens = get<uint32_t>(file, 64);
  const uint64_t data_bytes = get<uint64_t>(file, 72);
  // All sizes are checked in 64-bit arithmetic against each other before any is used.
  if (header_bytes != kStoreFixedHeaderBytes + identity_bytes + class_bytes + num_tokens * sizeof(TokenId))
    return StoreDecodeStatus::kTruncated;
  if (data_bytes > file.size() || header_bytes + data_bytes != file.size()) return StoreDecodeStatus::kTruncated;
  if (checksum(file.first(header_bytes), file.subspan(header_bytes)) != get<uint64_t>(file, kChecksumOffset))
    return StoreDecodeStatus::kBadChecksum;

  const char* identity = reinterpret_cast<const char*>(file.data()) + kStoreFixedHeaderBytes;
  if (std::string_view(identity, identity_bytes) != expected_identity) return StoreDecodeStatus::kForeign;
  const BlockHash key{get<uint64_t>(file, 16), get<uint64_t>(file, 24)};
  if (key != expected_key) return StoreDecodeStatus::kKeyMismatch;
  const size_t tokens_offset = kStoreFixedHeaderBytes + identity_bytes + class_bytes;
  if (num_tokens != expected_tokens.size() ||
      std::memcmp(file.data() + tokens_offset, expected_tokens.data(), num_tokens * sizeof(TokenId)) != 0)
    return StoreDecodeStatus::kTokenMismatch;

  out->key = key;
  out->parent_key = BlockHash{get<uint64_t>(file, 32), get<uint64_t>(file, 40)};
  out->created_ms = get<int64_t>(file, 48);
  out->model_identity.assign(identity, identity_bytes);
  out->traffic_class.assign(identity + identity_bytes, class_bytes);
  out->tokens.assign(expected_tokens.begin(), expected_tokens.end());
  out->data.clear();
  *data_offset = header_bytes;
  return StoreDecodeStatus::kOk;
}

}  // namespace dsinfer::kv
