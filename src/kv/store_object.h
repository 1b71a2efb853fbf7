// The on-disk format of one block-store object: a header and the KV bytes of one store unit
// (several device blocks of one prefix).
//
// Layout, little-endian:
//   [ 0] magic "DSKVOBJ1"                [ 8] u32 layout version  [12] u32 header bytes
//   [16] key (128-bit chain hash)        [32] parent key          [48] i64 created (Unix ms)
//   [56] u32 identity bytes  [60] u32 traffic-class bytes  [64] u32 num tokens  [68] u32 0
//   [72] u64 data bytes      [80] u64 checksum (XXH3-64 of the whole file with this field 0)
//   [88] identity, traffic class, tokens (int32, the whole prefix up to the unit's end), data
// The tokens of the whole prefix make a hit exact: an object is used only if its tokens equal
// the request's, so neither a hash collision nor a foreign writer can produce wrong KV.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dsinfer/engine_types.h"
#include "kv/block_hash.h"

namespace dsinfer::kv {

inline constexpr uint32_t kStoreLayoutVersion = 1;
inline constexpr size_t kStoreFixedHeaderBytes = 88;

struct StoreObject {
  BlockHash key;
  BlockHash parent_key;
  int64_t created_ms = 0;
  std::string model_identity;       // model + KV layout; objects of another identity are foreign
  std::string traffic_class;        // retention class (chat, agent, ...)
  std::vector<TokenId> tokens;      // the whole prefix this unit completes
  std::vector<std::byte> data;      // the unit's KV bytes
};

// The header bytes for `object` (with its checksum over header and data filled in).
std::vector<std::byte> encode_store_header(const StoreObject& object);

enum class StoreDecodeStatus {
  kOk,
  kTruncated,      // shorter or longer than its header says (torn write, truncated copy)
  kBadMagic,
  kBadVersion,
  kBadChecksum,
  kForeign,        // another model identity under our key
  kKeyMismatch,    // the file name and the key inside disagree
  kTokenMismatch,  // a different prefix (hash collision): valid, but not ours
};
const char* store_decode_status_name(StoreDecodeStatus status);

// Parses and verifies a whole file. On kOk fills `out` except `data` (left empty so callers can
// keep the file buffer instead of copying) and sets `data_offset`, where the data starts in
// `file`. Checks, in order: size, magic, version, checksum, identity, key, tokens.
StoreDecodeStatus decode_store_object(std::span<const std::byte> file, const BlockHash& expected_key,
                                      const std::string& expected_identity,
                                      std::span<const TokenId> expected_tokens, StoreObject* out,
                                      size_t* data_offset);

}  // namespace dsinfer::kv
