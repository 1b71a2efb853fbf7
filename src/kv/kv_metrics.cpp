#include "kv/kv_metrics.h"

#include <cstdio>
#include <sstream>

namespace dsinfer::kv {
namespace {

class Writer {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ << "# HELP dsinfer_kv_" << name << " " << help << "\n# TYPE dsinfer_kv_" << name << " " << type << "\n";
  }
  void sample(const char* name, const char* labels, double value) {
    char number[64];
    std::snprintf(number, sizeof(number), "%.17g", value);
    out_ << "dsinfer_kv_" << name << (labels[0] ? "{" : "") << labels << (labels[0] ? "}" : "") << " " << number << "\n";
  }
  void single(const char* name, const char* type, const char* help, double value) {
    family(name, type, help);
    sample(name, "", value);
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

}  // namespace

std::string format_kv_metrics(const KvCacheMetrics& m) {
  Writer w;
  const double prompt = static_cast<double>(m.num_prompt_tokens);
  auto rate = [&](int64_t tokens) { return prompt > 0 ? static_cast<double>(tokens) / prompt : 0.0; };

  w.family("prompt_tokens_total", "counter", "Prompt tokens by where their KV came from.");
  w.sample("prompt_tokens_total", "tier=\"device\"", static_cast<double>(m.num_device_hit_tokens));
  w.sample("prompt_tokens_total", "tier=\"host\"", static_cast<double>(m.num_host_hit_tokens));
  w.sample("prompt_tokens_total", "tier=\"store\"", static_cast<double>(m.num_store_hit_tokens));
  w.sample("prompt_tokens_total", "tier=\"computed\"", static_cast<double>(m.num_computed_tokens()));
  w.family("hit_rate", "gauge", "Fraction of prompt tokens served from each cache tier since start.");
  w.sample("hit_rate", "tier=\"device\"", rate(m.num_device_hit_tokens));
  w.sample("hit_rate", "tier=\"host\"", rate(m.num_host_hit_tokens));
  w.sample("hit_rate", "tier=\"store\"", rate(m.num_store_hit_tokens));
  w.sample("hit_rate", "tier=\"all\"",
           rate(m.num_device_hit_tokens + m.num_host_hit_tokens + m.num_store_hit_tokens));

  w.single("device_blocks_used", "gauge", "Device KV blocks held by requests.", m.num_device_blocks_used);
  w.single("device_blocks_total", "gauge", "Device KV blocks in the pool.", m.num_device_blocks_total);
  w.single("device_blocks_cached", "gauge", "Device KV blocks in the prefix index.", m.num_device_blocks_cached);
  w.single("blocks_offloaded_total", "counter", "Device blocks copied to the host tier on eviction.",
           static_cast<double>(m.num_blocks_offloaded));
  w.single("blocks_restored_total", "counter", "Host-tier blocks copied back to the device on a hit.",
           static_cast<double>(m.num_blocks_restored));
  w.single("host_bytes", "gauge", "Bytes held by the host tier.", static_cast<double>(m.host_bytes_used));
  w.single("host_capacity_bytes", "gauge", "Capacity of the host tier.", static_cast<double>(m.host_capacity_bytes));
  w.single("host_evictions_total", "counter", "Blocks dropped from the host tier.",
           static_cast<double>(m.num_host_evictions));
  if (!m.has_store) return w.str();

  const KvStoreMetrics& s = m.store;
  w.single("store_bytes", "gauge", "Bytes in the block store directory (last scan plus writes since).",
           static_cast<double>(s.store_bytes));
  w.single("store_objects", "gauge", "Objects in the block store directory.", static_cast<double>(s.num_objects));
  w.family("store_io_bytes_total", "counter", "Bytes moved by the block store.");
  w.sample("store_io_bytes_total", "direction=\"read\"", static_cast<double>(s.bytes_read));
  w.sample("store_io_bytes_total", "direction=\"written\"", static_cast<double>(s.bytes_written));
  w.family("store_reads_total", "counter", "Block store reads by result.");
  w.sample("store_reads_total", "result=\"hit\"", static_cast<double>(s.num_read_hits));
  w.sample("store_reads_total", "result=\"miss\"", static_cast<double>(s.num_read_misses));
  w.family("store_writes_total", "counter", "Block store writes by result.");
  w.sample("store_writes_total", "result=\"written\"", static_cast<double>(s.num_writes));
  w.sample("store_writes_total", "result=\"skipped\"", static_cast<double>(s.num_writes_skipped));
  w.sample("store_writes_total", "result=\"dropped\"", static_cast<double>(s.num_writes_dropped));
  w.sample("store_writes_total", "result=\"error\"", static_cast<double>(s.num_write_errors));
  w.family("store_removed_total", "counter", "Block store objects removed, by reason.");
  w.sample("store_removed_total", "reason=\"corrupt\"", static_cast<double>(s.num_removed_corrupt));
  w.sample("store_removed_total", "reason=\"expired\"", static_cast<double>(s.num_removed_expired));
  w.sample("store_removed_total", "reason=\"capacity\"", static_cast<double>(s.num_evicted));
  return w.str();
}

}  // namespace dsinfer::kv
