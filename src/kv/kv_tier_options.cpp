#include "kv/kv_tier_options.h"

#include <charconv>

namespace dsinfer::kv {
namespace {

// A non-negative integer followed by an optional one-letter unit.
bool split_number(std::string_view text, int64_t* number, char* unit) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *number);
  if (ec != std::errc() || *number < 0) return false;
  if (ptr == end) {
    *unit = 0;
    return true;
  }
  const std::string_view rest(ptr + 1, static_cast<size_t>(end - ptr - 1));
  if (!(rest.empty() || rest == "B" || rest == "b" || rest == "iB")) return false;  // G, GB, GiB
  *unit = *ptr;
  return true;
}

}  // namespace

Result<int64_t> parse_byte_size(std::string_view text) {
  int64_t n = 0;
  char unit = 0;
  if (!split_number(text, &n, &unit)) return invalid_argument("bad size '" + std::string(text) + "' (e.g. 512M, 64G)");
  int shift = 0;
  switch (unit) {
    case 0: case 'B': case 'b': shift = 0; break;
    case 'K': case 'k': shift = 10; break;
    case 'M': case 'm': shift = 20; break;
    case 'G': case 'g': shift = 30; break;
    case 'T': case 't': shift = 40; break;
    default: return invalid_argument("bad size unit in '" + std::string(text) + "' (use K, M, G or T)");
  }
  if (n > (INT64_MAX >> shift)) return invalid_argument("size '" + std::string(text) + "' is too large");
  return n << shift;
}

Result<int64_t> parse_duration_ms(std::string_view text) {
  int64_t n = 0;
  char unit = 0;
  if (!split_number(text, &n, &unit) || text.size() < 2 || text.back() != unit)
    return invalid_argument("bad duration '" + std::string(text) + "' (e.g. 90m, 72h, 3d)");
  int64_t scale = 0;
  switch (unit) {
    case 's': scale = 1000; break;
    case 'm': scale = 60'000; break;
    case 'h': scale = 3'600'000; break;
    case 'd': scale = kMsPerDay; break;
    default: return invalid_argument("bad duration unit in '" + std::string(text) + "' (use s, m, h or d)");
  }
  if (n == 0 || n > INT64_MAX / scale) return invalid_argument("duration '" + std::string(text) + "' is out of range");
  return n * scale;
}

Result<bool> apply_kv_flag(std::string_view flag, std::optional<std::string_view> value, KvTierOptions* o,
                           bool* used_value) {
  *used_value = false;
  if (flag == "--no-kv-store") {
    o->store_enabled = false;
    return true;
  }
  const bool ours = flag == "--kv-store" || flag == "--kv-store-capacity" || flag == "--kv-host-cache" ||
                    flag == "--kv-ttl-agent" || flag == "--kv-ttl-chat" || flag == "--kv-store-unit";
  if (!ours) return false;
  if (!value) return invalid_argument(std::string(flag) + " needs a value");
  *used_value = true;
  if (flag == "--kv-store") {
    if (value->empty()) return invalid_argument("--kv-store needs a directory");
    o->store_enabled = true;
    o->store_directory = std::string(*value);
    return true;
  }
  if (flag == "--kv-store-unit") {
    int n = 0;
    auto [ptr, ec] = std::from_chars(value->data(), value->data() + value->size(), n);
    if (ec != std::errc() || ptr != value->data() + value->size() || n <= 0)
      return invalid_argument("--kv-store-unit needs a positive token count");
    o->store_unit_tokens = n;
    return true;
  }
  const bool is_size = flag == "--kv-store-capacity" || flag == "--kv-host-cache";
  Result<int64_t> parsed = is_size ? parse_byte_size(*value) : parse_duration_ms(*value);
  if (!parsed.ok()) return Status(parsed.status().code(), std::string(flag) + ": " + parsed.status().message());
  if (flag == "--kv-store-capacity") o->store_capacity_bytes = *parsed;
  else if (flag == "--kv-host-cache") o->host_cache_bytes = *parsed;
  else if (flag == "--kv-ttl-agent") o->ttl_agent_ms = *parsed;
  else o->ttl_chat_ms = *parsed;
  return true;
}

std::shared_ptr<KvBlockStore> open_block_store(const KvTierOptions& o) {
  if (!o.store_enabled) return nullptr;
  KvBlockStoreConfig c;
  c.directory = o.store_directory.empty() ? default_kv_store_directory() : o.store_directory;
  c.capacity_bytes = o.store_capacity_bytes;
  c.ttl_ms_by_class = {{"agent", o.ttl_agent_ms}, {"chat", o.ttl_chat_ms}};
  return std::make_shared<KvBlockStore>(c);
}

}  // namespace dsinfer::kv
