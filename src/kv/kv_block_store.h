// The block store: KV cache units persisted as files in a directory that any number of
// dsinfer processes may share (local disk, or a shared POSIX mount such as 3FS, CephFS, NFS).
//
// Contract:
// - One object per store unit, named by its 128-bit chain key: DIR/ab/abcdef....kvb. Objects
//   are written to a temporary file in the same folder and renamed into place, so a reader
//   (in this or another process) sees a whole object or none. A write of a key that already
//   exists is skipped; two writers racing on one key both succeed and the last rename wins
//   (their contents are equal: a key names one prefix of one model).
// - Reads verify size, magic, layout version, checksum, model identity, key and the whole
//   prefix's token ids. A bad, torn or foreign object is a miss and is removed; an object for
//   another prefix (a hash collision) is a miss and is left alone.
// - Retention: file times carry the policy so every process sharing the directory sees it and
//   it survives restarts. mtime = expiry (last access + TTL of the object's traffic class),
//   atime = last access. A read hit renews both. The janitor removes expired objects and
//   temporary files left by crashed writers, then evicts least recently accessed objects
//   while the folder is over capacity.
// - I/O runs on the store's own threads through io_uring (pread/pwrite if the kernel refuses
//   io_uring); no call here blocks on the disk except read(), flush() and run_janitor().
//   Writes are fire-and-forget: past a bound of queued bytes they are dropped, never waited on.
// - Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kv/byte_buffer.h"
#include "kv/kv_clock.h"
#include "kv/store_object.h"

namespace dsinfer::kv {

inline constexpr int64_t kMsPerDay = 24LL * 3600 * 1000;

struct KvBlockStoreConfig {
  std::string directory;                 // created if missing; see default_kv_store_directory()
  int64_t capacity_bytes = 0;            // 0: unbounded
  double capacity_low_watermark = 0.9;   // eviction stops at this fraction of the capacity
  std::map<std::string, int64_t> ttl_ms_by_class = {{"agent", 3 * kMsPerDay}, {"chat", 7 * kMsPerDay}};
  std::string default_traffic_class = "chat";  // for objects with an unknown or empty class
  int num_io_threads = 1;
  int io_queue_depth = 32;               // objects in flight per I/O thread
  int64_t max_queued_write_bytes = 256LL << 20;
  int64_t read_buffer_pool_bytes = 256LL << 20;  // released read buffers kept for reuse
  int64_t janitor_interval_ms = 60'000;  // 0: no janitor thread; call run_janitor()
  int64_t stale_temp_age_ms = 10 * 60'000;  // temporary files older than this are a dead writer's
  bool sync_writes = false;              // fdatasync before rename: survive power loss, not only crashes
  bool use_io_uring = true;
  std::shared_ptr<const KvClock> clock;  // null: the system clock
};

enum class StoreReadOutcome {
  kPending,
  kHit,
  kMiss,       // no such object
  kExpired,    // past its TTL: removed
  kRemoved,    // corrupt, torn or foreign: removed
  kMismatch,   // a valid object for another prefix
  kIoError,
};
const char* store_read_outcome_name(StoreReadOutcome outcome);

// The result of one read; filled by an I/O thread, then ready() turns true.
class StoreRead {
 public:
  bool ready() const { return done_.load(std::memory_order_acquire); }
  void wait() const { done_.wait(false, std::memory_order_acquire); }
  // Waits at most about `ms` milliseconds; returns ready().
  bool wait_for_ms(int ms) const;
  // Valid once ready().
  StoreReadOutcome outcome() const { return outcome_; }
  bool hit() const { return outcome_ == StoreReadOutcome::kHit; }
  const StoreObject& header() const { return header_; }  // data left empty; see data()
  std::span<const std::byte> data() const;
  // The file buffer that data() points into, for holding the bytes without a copy.
  const std::shared_ptr<const ByteBuffer>& buffer() const { return buffer_; }
  size_t data_offset() const { return data_offset_; }

 private:
  friend class KvBlockStore;
  std::atomic<bool> done_{false};
  StoreReadOutcome outcome_ = StoreReadOutcome::kPending;
  StoreObject header_;
  std::shared_ptr<const ByteBuffer> buffer_;
  size_t data_offset_ = 0;
};

struct KvStoreMetrics {
  int64_t num_reads = 0;
  int64_t num_read_hits = 0;
  int64_t num_read_misses = 0;       // absent, expired, removed, mismatched or failed
  int64_t num_removed_corrupt = 0;   // bad, torn or foreign objects removed on read
  int64_t num_removed_expired = 0;   // by reads and the janitor
  int64_t num_evicted = 0;           // by the janitor for capacity
  int64_t num_writes = 0;
  int64_t num_writes_skipped = 0;    // the object already existed
  int64_t num_writes_dropped = 0;    // the write queue was over its bound
  int64_t num_write_errors = 0;
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  int64_t store_bytes = 0;           // last janitor scan plus writes since
  int64_t num_objects = 0;           // last janitor scan plus writes since
};

struct JanitorReport {
  int num_expired = 0;
  int num_evicted = 0;
  int num_stale_temps = 0;
  int num_objects = 0;      // after the pass
  int64_t store_bytes = 0;  // after the pass
};

class KvBlockStore {
 public:
  explicit KvBlockStore(KvBlockStoreConfig config);  // throws Error if DIR cannot be created
  ~KvBlockStore();  // finishes queued work, then stops its threads
  KvBlockStore(const KvBlockStore&) = delete;
  KvBlockStore& operator=(const KvBlockStore&) = delete;

  // Queues a write of `object` (created_ms is set if 0). False if dropped.
  bool write_async(StoreObject object);
  // Queues a read of `key`, accepted only with this identity and exactly these prefix tokens.
  std::shared_ptr<StoreRead> read_async(const BlockHash& key, std::string model_identity,
                                        std::vector<TokenId> expected_tokens);
  std::shared_ptr<StoreRead> read(const BlockHash& key, std::string model_identity,
                                  std::vector<TokenId> expected_tokens);  // blocking

  bool contains(const BlockHash& key) const;  // the object file exists (not verified)
  void flush();                                // waits until every queued job is done
  JanitorReport run_janitor();
  KvStoreMetrics metrics() const;
  std::string object_path(const BlockHash& key) const;
  int64_t ttl_ms(const std::string& traffic_class) const;
  int64_t now_ms() const { return clock_->now_ms(); }
  const KvBlockStoreConfig& config() const { return config_; }
  bool using_io_uring() const { return using_io_uring_.load(); }

 private:
  struct Job;
  struct Inflight;
  void io_loop();
  void janitor_loop();
  void run_batch(void* ring, std::vector<Job>& batch);
  void prepare(Inflight& f);
  void finish(Inflight& f);
  void complete_read(Inflight& f, StoreReadOutcome outcome);
  bool enqueue(Job job);

  KvBlockStoreConfig config_;
  std::shared_ptr<const KvClock> clock_;
  std::atomic<bool> using_io_uring_{true};

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<Job> queue_;
  int64_t num_outstanding_ = 0;     // queued + in flight
  int64_t queued_write_bytes_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> io_threads_;

  std::mutex janitor_mu_;           // one janitor pass at a time
  std::condition_variable janitor_cv_;
  bool janitor_wake_ = false;
  std::thread janitor_thread_;

  ByteBufferPool read_buffers_;
  struct AtomicMetrics;
  std::unique_ptr<AtomicMetrics> metrics_;
};

// $XDG_CACHE_HOME/dsinfer/kv, else ~/.cache/dsinfer/kv.
std::string default_kv_store_directory();

}  // namespace dsinfer::kv
