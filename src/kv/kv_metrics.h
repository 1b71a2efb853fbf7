// KV cache counters in the Prometheus text format, for the server's /metrics.
#pragma once

#include <string>

#include "kv/kv_cache_manager.h"

namespace dsinfer::kv {

// Lines such as `dsinfer_kv_prompt_tokens_total{tier="store"} 4096`, each family with its
// HELP and TYPE lines. Hit rates are fractions of prompt tokens (0 before the first request).
std::string format_kv_metrics(const KvCacheMetrics& m);

}  // namespace dsinfer::kv
