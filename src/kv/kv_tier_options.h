// Command-line settings of the KV cache tiers, shared by `serve` and `generate`, and the
// store they open.
//
//   --kv-store DIR             block store directory (default ~/.cache/dsinfer/kv)
//   --no-kv-store              no block store (the default outside `serve`)
//   --kv-store-capacity SIZE   bound on the directory, e.g. 200G (default: unbounded)
//   --kv-host-cache SIZE       host tier, e.g. 8G (default 0: off)
//   --kv-ttl-agent DURATION    retention of `agent` traffic, e.g. 3d, 72h (default 3d)
//   --kv-ttl-chat DURATION     retention of `chat` traffic (default 7d)
//   --kv-store-unit N          tokens per store object (default 128)
// SIZE takes K, M, G, T suffixes (powers of 1024); DURATION takes s, m, h, d.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "kv/kv_block_store.h"

namespace dsinfer::kv {

struct KvTierOptions {
  bool store_enabled = false;   // `serve` turns it on before parsing its flags
  std::string store_directory;  // empty: default_kv_store_directory()
  int64_t store_capacity_bytes = 0;
  int64_t host_cache_bytes = 0;
  int64_t ttl_agent_ms = 3 * kMsPerDay;
  int64_t ttl_chat_ms = 7 * kMsPerDay;
  int store_unit_tokens = 128;
};

// If `flag` is one of the flags above, applies it (taking `value` when it needs one) and
// returns true; `*used_value` says whether `value` was consumed. Returns an error status for
// a bad value, false (ok) for a flag that is not ours.
Result<bool> apply_kv_flag(std::string_view flag, std::optional<std::string_view> value, KvTierOptions* options,
                           bool* used_value);

Result<int64_t> parse_byte_size(std::string_view text);     // "512M" → 536870912
Result<int64_t> parse_duration_ms(std::string_view text);   // "3d" → 259200000

// Opens the store the options describe (null when disabled). Throws Error if the directory
// cannot be created.
std::shared_ptr<KvBlockStore> open_block_store(const KvTierOptions& options);

}  // namespace dsinfer::kv
