#include "kv/kv_block_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "core/logging.h"
#include "core/status.h"

namespace dsinfer::kv {
namespace {

constexpr const char* kObjectSuffix = ".kvb";
constexpr const char* kTempPrefix = ".tmp-";
constexpr int64_t kMaxObjectBytes = 4LL << 30;  // anything larger is not ours
// Names temporary files; process-wide so two stores of one process never pick the same name.
std::atomic<uint64_t> g_temp_counter{0};

timespec ms_to_timespec(int64_t ms) {
  timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1'000'000;
  return ts;
}

int64_t timespec_to_ms(const timespec& ts) { return ts.tv_sec * 1000LL + ts.tv_nsec / 1'000'000; }

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Removes `path` only if it is still the file `fd_stat` describes, so a good object that another
// process renamed into place after our read is not deleted.
void remove_if_same(const std::string& path, const struct stat& fd_stat) {
  struct stat now;
  if (::stat(path.c_str(), &now) == 0 && now.st_ino == fd_stat.st_ino && now.st_dev == fd_stat.st_dev)
    ::unlink(path.c_str());
}

}  // namespace

const char* store_read_outcome_name(StoreReadOutcome outcome) {
  switch (outcome) {
    case StoreReadOutcome::kPending: return "pending";
    case StoreReadOutcome::kHit: return "hit";
    case StoreReadOutcome::kMiss: return "miss";
    case StoreReadOutcome::kExpired: return "expired";
    case StoreReadOutcome::kRemoved: return "removed";
    case StoreReadOutcome::kMismatch: return "mismatch";
    case StoreReadOutcome::kIoError: return "io error";
  }
  return "unknown";
}

bool StoreRead::wait_for_ms(int ms) const {
  // Reads take milliseconds: polling at a fine grain costs nothing worth a condition variable.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!ready() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  return ready();
}

std::span<const std::byte> StoreRead::data() const {
  if (!buffer_) return {};
  return buffer_->span().subspan(data_offset_);
}

std::string default_kv_store_directory() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/dsinfer/kv";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/dsinfer/kv";
}

struct KvBlockStore::AtomicMetrics {
  std::atomic<int64_t> num_reads{0}, num_read_hits{0}, num_read_misses{0}, num_removed_corrupt{0},
      num_removed_expired{0}, num_evicted{0}, num_writes{0}, num_writes_skipped{0}, num_writes_dropped{0}, num_write_errors{0},
      bytes_read{0}, bytes_written{0}, store_bytes{0}, num_objects{0};
};

struct KvBlockStore::Job {
  bool is_write = false;
  StoreObject object;                  // write: the object; read: key + identity + tokens
  std::shared_ptr<StoreRead> read;     // read only
};

// One job's I/O in a batch: up to two operations (header and data for writes, the whole file
// for reads) submitted together with every other job's.
struct KvBlockStore::Inflight {
  Job* job = nullptr;
  int fd = -1;
  std::string path;
  std::string temp_path;
  struct stat st {};
  std::vector<std::byte> header;                 // write
  std::shared_ptr<ByteBuffer> file;              // read
  int num_ops_left = 0;
  struct Op {
    std::byte* buf = nullptr;
    size_t len = 0;
    size_t done = 0;
    uint64_t offset = 0;
  };
  Op ops[2];
  int num_ops = 0;
  int error = 0;         // errno of the first failed operation
  bool finished = false; // settled during prepare (miss, expired, open failure)
};

KvBlockStore::KvBlockStore(KvBlockStoreConfig config)
    : config_(std::move(config)),
      read_buffers_(config_.read_buffer_pool_bytes),
      metrics_(std::make_unique<AtomicMetrics>()) {
  clock_ = config_.clock ? config_.clock : std::make_shared<SystemKvClock>();
  if (config_.directory.empty()) config_.directory = default_kv_store_directory();
  std::error_code ec;
  std::filesystem::create_directories(config_.directory, ec);
  if (ec || !std::filesystem::is_directory(config_.directory))
    throw Error(StatusCode::kInvalidArgument,
                "kv store: cannot create directory '" + config_.directory + "': " + ec.message());
  if (config_.num_io_threads < 1) config_.num_io_threads = 1;
  if (config_.io_queue_depth < 1) config_.io_queue_depth = 1;
  using_io_uring_ = config_.use_io_uring;
  for (int i = 0; i < config_.num_io_threads; ++i) io_threads_.emplace_back([this] { io_loop(); });
  if (config_.janitor_interval_ms > 0) janitor_thread_ = std::thread([this] { janitor_loop(); });
}

KvBlockStore::~KvBlockStore() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : io_threads_) t.join();
  {
    std::lock_guard lock(janitor_mu_);
    janitor_wake_ = true;
  }
  janitor_cv_.notify_all();
  if (janitor_thread_.joinable()) janitor_thread_.join();
}

std::string KvBlockStore::object_path(const BlockHash& key) const {
  const std::string hex = key.to_hex();
  return config_.directory + "/" + hex.substr(0, 2) + "/" + hex + kObjectSuffix;
}

int64_t KvBlockStore::ttl_ms(const std::string& traffic_class) const {
  auto it = config_.ttl_ms_by_class.find(traffic_class);
  if (it == config_.ttl_ms_by_class.end()) it = config_.ttl_ms_by_class.find(config_.default_traffic_class);
  return it == config_.ttl_ms_by_class.end() ? 7 * kMsPerDay : it->second;
}

bool KvBlockStore::contains(const BlockHash& key) const { return ::access(object_path(key).c_str(), F_OK) == 0; }

KvStoreMetrics KvBlockStore::metrics() const {
  const AtomicMetrics& m = *metrics_;
  KvStoreMetrics out;
  out.num_reads = m.num_reads;
  out.num_read_hits = m.num_read_hits;
  out.num_read_misses = m.num_read_misses;
  out.num_removed_corrupt = m.num_removed_corrupt;
  out.num_removed_expired = m.num_removed_expired;
  out.num_evicted = m.num_evicted;
  out.num_writes = m.num_writes;
  out.num_writes_skipped = m.num_writes_skipped;
  out.num_writes_dropped = m.num_writes_dropped;
  out.num_write_errors = m.num_write_errors;
  out.bytes_read = m.bytes_read;
  out.bytes_written = m.bytes_written;
  out.store_bytes = m.store_bytes;
  out.num_objects = m.num_objects;
  return out;
}

// ---- queueing ----

bool KvBlockStore::enqueue(Job job) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
    if (job.is_write) {
      const int64_t bytes = static_cast<int64_t>(job.object.data.size());
      if (queued_write_bytes_ + bytes > config_.max_queued_write_bytes && queued_write_bytes_ > 0) return false;
      queued_write_bytes_ += bytes;
    }
    queue_.push_back(std::move(job));
    ++num_outstanding_;
  }
  work_cv_.notify_one();
  return true;
}

bool KvBlockStore::write_async(StoreObject object) {
  if (object.created_ms == 0) object.created_ms = clock_->now_ms();
  Job job;
  job.is_write = true;
  job.object = std::move(object);
  if (!enqueue(std::move(job))) {
    metrics_->num_writes_dropped++;
    return false;
  }
  return true;
}

std::shared_ptr<StoreRead> KvBlockStore::read_async(const BlockHash& key, std::string model_identity,
                                                    std::vector<TokenId> expected_tokens) {
  auto read = std::make_shared<StoreRead>();
  Job job;
  job.object.key = key;
  job.object.model_identity = std::move(model_identity);
  job.object.tokens = std::move(expected_tokens);
  job.read = read;
  metrics_->num_reads++;
  if (!enqueue(std::move(job))) {
    read->outcome_ = StoreReadOutcome::kIoError;
    metrics_->num_read_misses++;
    read->done_.store(true, std::memory_order_release);
    read->done_.notify_all();
  }
  return read;
}

std::shared_ptr<StoreRead> KvBlockStore::read(const BlockHash& key, std::string model_identity,
                                              std::vector<TokenId> expected_tokens) {
  auto r = read_async(key, std::move(model_identity), std::move(expected_tokens));
  r->wait();
  return r;
}

void KvBlockStore::flush() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return num_outstanding_ == 0; });
}

// ---- the I/O threads ----

void KvBlockStore::io_loop() {
  io_uring ring;
  bool have_ring = false;
  if (using_io_uring_.load()) {
    const int rc = io_uring_queue_init(static_cast<unsigned>(2 * config_.io_queue_depth), &ring, 0);
    have_ring = rc == 0;
    if (!have_ring) {
      DS_LOG_WARN("kv store: io_uring unavailable (" << std::strerror(-rc) << "), using pread/pwrite");
      using_io_uring_ = false;
    }
  }
  for (;;) {
    std::vector<Job> batch;
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stopping and drained
      while (!queue_.empty() && static_cast<int>(batch.size()) < config_.io_queue_depth) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    run_batch(have_ring ? &ring : nullptr, batch);
    int64_t write_bytes = 0;
    for (const Job& j : batch)
      if (j.is_write) write_bytes += static_cast<int64_t>(j.object.data.size());
    {
      std::lock_guard lock(mu_);
      queued_write_bytes_ -= write_bytes;
      num_outstanding_ -= static_cast<int64_t>(batch.size());
    }
    idle_cv_.notify_all();
  }
  if (have_ring) io_uring_queue_exit(&ring);
}

void KvBlockStore::run_batch(void* ring_ptr, std::vector<Job>& batch) {
  std::vector<Inflight> flights(batch.size());
  auto* ring = static_cast<io_uring*>(ring_ptr);
  if (!ring) {
    for (size_t i = 0; i < batch.size(); ++i) {
      Inflight& f = flights[i];
      f.job = &batch[i];
      prepare(f);
      for (int oi = 0; oi < f.num_ops && !f.error; ++oi) {
        Inflight::Op& op = f.ops[oi];
        while (op.done < op.len) {
          const ssize_t n = f.job->is_write
                                ? ::pwrite(f.fd, op.buf + op.done, op.len - op.done, op.offset + op.done)
                                : ::pread(f.fd, op.buf + op.done, op.len - op.done, op.offset + op.done);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            f.error = n < 0 ? errno : EIO;
            break;
          }
          op.done += static_cast<size_t>(n);
        }
      }
      finish(f);
    }
    return;
  }

  auto queue_op = [&](size_t fi, int oi) {
    Inflight& f = flights[fi];
    Inflight::Op& op = f.ops[oi];
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (!sqe) {  // the submission queue is full: hand what it holds to the kernel first
      io_uring_submit(ring);
      sqe = io_uring_get_sqe(ring);
    }
    DS_CHECK(sqe != nullptr);
    const unsigned len = static_cast<unsigned>(std::min<size_t>(op.len - op.done, 1u << 30));
    if (f.job->is_write)
      io_uring_prep_write(sqe, f.fd, op.buf + op.done, len, op.offset + op.done);
    else
      io_uring_prep_read(sqe, f.fd, op.buf + op.done, len, op.offset + op.done);
    io_uring_sqe_set_data64(sqe, (static_cast<uint64_t>(fi) << 1) | static_cast<uint64_t>(oi));
  };
  // Submit each job as soon as it is prepared so the disk works while the next one is set up,
  // and verify each job as soon as its last operation completes.
  int num_pending = 0;
  for (size_t fi = 0; fi < flights.size(); ++fi) {
    Inflight& f = flights[fi];
    f.job = &batch[fi];
    prepare(f);
    f.num_ops_left = f.finished ? 0 : f.num_ops;
    for (int oi = 0; oi < f.num_ops_left; ++oi) {
      queue_op(fi, oi);
      ++num_pending;
    }
    if (f.num_ops_left > 0) io_uring_submit(ring);
  }
  while (num_pending > 0) {
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(ring, &cqe);
    if (rc == -EINTR) continue;
    DS_CHECK_MSG(rc == 0, "io_uring_wait_cqe: " << std::strerror(-rc));
    const uint64_t tag = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    --num_pending;
    const size_t fi = tag >> 1;
    const int oi = static_cast<int>(tag & 1);
    Inflight& f = flights[fi];
    Inflight::Op& op = f.ops[oi];
    bool op_done = true;
    if (res == -EINTR || res == -EAGAIN) {
      op_done = false;
    } else if (res < 0) {
      if (!f.error) f.error = -res;
    } else if (res == 0) {
      if (!f.error) f.error = EIO;  // the file shrank under us
    } else {
      op.done += static_cast<size_t>(res);
      op_done = op.done >= op.len;
    }
    if (!op_done) {
      queue_op(fi, oi);
      ++num_pending;
      io_uring_submit(ring);
    } else if (--f.num_ops_left == 0) {
      finish(f);
    }
  }
}

void KvBlockStore::complete_read(Inflight& f, StoreReadOutcome outcome) {
  StoreRead& r = *f.job->read;
  r.outcome_ = outcome;
  if (outcome == StoreReadOutcome::kHit) {
    metrics_->num_read_hits++;
    metrics_->bytes_read += static_cast<int64_t>(f.file->size());
  } else {
    metrics_->num_read_misses++;
  }
  if (f.fd >= 0) ::close(f.fd);
  f.fd = -1;
  f.finished = true;
  r.done_.store(true, std::memory_order_release);
  r.done_.notify_all();
}

void KvBlockStore::prepare(Inflight& f) {
  Job& job = *f.job;
  f.path = object_path(job.object.key);
  const int64_t now = clock_->now_ms();
  if (!job.is_write) {
    // O_NOATIME: atime is ours to set (last access); a plain read must not move it.
    f.fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOATIME);
    if (f.fd < 0 && errno == EPERM) f.fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) return complete_read(f, errno == ENOENT ? StoreReadOutcome::kMiss : StoreReadOutcome::kIoError);
    if (::fstat(f.fd, &f.st) != 0) return complete_read(f, StoreReadOutcome::kIoError);
    if (timespec_to_ms(f.st.st_mtim) <= now) {
      remove_if_same(f.path, f.st);
      metrics_->num_removed_expired++;
      return complete_read(f, StoreReadOutcome::kExpired);
    }
    if (f.st.st_size < static_cast<off_t>(kStoreFixedHeaderBytes) || f.st.st_size > kMaxObjectBytes) {
      remove_if_same(f.path, f.st);
      metrics_->num_removed_corrupt++;
      return complete_read(f, StoreReadOutcome::kRemoved);
    }
    f.file = read_buffers_.acquire(static_cast<size_t>(f.st.st_size));
    f.ops[0] = {f.file->data(), f.file->size(), 0, 0};
    f.num_ops = 1;
    return;
  }
  if (::access(f.path.c_str(), F_OK) == 0) {
    // Another writer (maybe another process) got there first; objects of one key are equal.
    metrics_->num_writes_skipped++;
    f.finished = true;
    return;
  }
  f.header = encode_store_header(job.object);
  const std::string folder = f.path.substr(0, f.path.rfind('/'));
  ::mkdir(folder.c_str(), 0755);  // EEXIST is the common case
  f.temp_path = folder + "/" + kTempPrefix + job.object.key.to_hex() + "-" + std::to_string(::getpid()) + "-" +
                std::to_string(g_temp_counter++);
  f.fd = ::open(f.temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (f.fd < 0) {
    f.error = errno;
    f.finished = true;
    metrics_->num_write_errors++;
    DS_LOG_WARN("kv store: cannot create " << f.temp_path << ": " << std::strerror(errno));
    return;
  }
  f.ops[0] = {f.header.data(), f.header.size(), 0, 0};
  f.ops[1] = {job.object.data.data(), job.object.data.size(), 0, f.header.size()};
  f.num_ops = job.object.data.empty() ? 1 : 2;
}

void KvBlockStore::finish(Inflight& f) {
  if (f.finished) return;
  Job& job = *f.job;
  const int64_t now = clock_->now_ms();
  if (!job.is_write) {
    if (f.error) return complete_read(f, StoreReadOutcome::kIoError);
    size_t data_offset = 0;
    StoreRead& r = *job.read;
    const StoreDecodeStatus status = decode_store_object(f.file->span(), job.object.key, job.object.model_identity,
                                                         job.object.tokens, &r.header_, &data_offset);
    if (status == StoreDecodeStatus::kOk) {
      const timespec times[2] = {ms_to_timespec(now), ms_to_timespec(now + ttl_ms(r.header_.traffic_class))};
      ::futimens(f.fd, times);  // renew: last access and expiry
      r.buffer_ = f.file;
      r.data_offset_ = data_offset;
      return complete_read(f, StoreReadOutcome::kHit);
    }
    if (status == StoreDecodeStatus::kTokenMismatch) return complete_read(f, StoreReadOutcome::kMismatch);
    DS_LOG_WARN("kv store: removing " << f.path << ": " << store_decode_status_name(status));
    remove_if_same(f.path, f.st);
    metrics_->num_removed_corrupt++;
    return complete_read(f, StoreReadOutcome::kRemoved);
  }
  bool ok = f.error == 0;
  if (ok && config_.sync_writes) ok = ::fdatasync(f.fd) == 0;
  if (ok) {
    const timespec times[2] = {ms_to_timespec(now), ms_to_timespec(now + ttl_ms(job.object.traffic_class))};
    ok = ::futimens(f.fd, times) == 0;
  }
  ok = (::close(f.fd) == 0) && ok;
  f.fd = -1;
  if (ok) ok = ::rename(f.temp_path.c_str(), f.path.c_str()) == 0;
  if (!ok) {
    ::unlink(f.temp_path.c_str());
    metrics_->num_write_errors++;
    DS_LOG_WARN("kv store: write of " << f.path << " failed: " << std::strerror(f.error ? f.error : errno));
    return;
  }
  const int64_t bytes = static_cast<int64_t>(f.header.size() + job.object.data.size());
  metrics_->num_writes++;
  metrics_->bytes_written += bytes;
  metrics_->num_objects++;
  const int64_t size = (metrics_->store_bytes += bytes);
  if (config_.capacity_bytes > 0 && size > config_.capacity_bytes) {
    std::lock_guard lock(janitor_mu_);
    janitor_wake_ = true;
    janitor_cv_.notify_all();
  }
}

// ---- retention ----

void KvBlockStore::janitor_loop() {
  for (;;) {
    run_janitor();
    std::unique_lock lock(janitor_mu_);
    janitor_cv_.wait_for(lock, std::chrono::milliseconds(config_.janitor_interval_ms), [&] { return janitor_wake_; });
    janitor_wake_ = false;
    std::lock_guard state_lock(mu_);
    if (stopping_) return;
  }
}

JanitorReport KvBlockStore::run_janitor() {
  static std::mutex pass_mu;  // one pass per process at a time; other processes may run theirs
  std::lock_guard pass_lock(pass_mu);
  JanitorReport report;
  const int64_t now = clock_->now_ms();
  struct Entry {
    int64_t access_ms;
    int64_t bytes;
    std::string path;
  };
  std::vector<Entry> live;
  int64_t total_bytes = 0;
  DIR* top = ::opendir(config_.directory.c_str());
  if (!top) return report;
  while (dirent* d = ::readdir(top)) {
    const std::string sub = d->d_name;
    if (sub.size() != 2 || !std::isxdigit(static_cast<unsigned char>(sub[0])) ||
        !std::isxdigit(static_cast<unsigned char>(sub[1])))
      continue;
    const std::string folder = config_.directory + "/" + sub;
    DIR* dir = ::opendir(folder.c_str());
    if (!dir) continue;
    while (dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      const std::string path = folder + "/" + name;
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // raced with a remover
      if (name.rfind(kTempPrefix, 0) == 0) {
        // A temporary file's ctime is when its writer last changed it (its writes, and the times
        // it sets just before the rename), so an old one belongs to a writer that died. Not its
        // mtime: that is the object's expiry, days ahead, once the writer has set the times, and a
        // writer killed between that and the rename would leave the file until then.
        if (now - timespec_to_ms(st.st_ctim) > config_.stale_temp_age_ms && ::unlink(path.c_str()) == 0)
          ++report.num_stale_temps;
        continue;
      }
      if (!ends_with(name, kObjectSuffix)) continue;
      if (timespec_to_ms(st.st_mtim) <= now) {
        if (::unlink(path.c_str()) == 0) {
          ++report.num_expired;
          metrics_->num_removed_expired++;
        }
        continue;
      }
      live.push_back({timespec_to_ms(st.st_atim), static_cast<int64_t>(st.st_size), path});
      total_bytes += st.st_size;
    }
    ::closedir(dir);
  }
  ::closedir(top);
  if (config_.capacity_bytes > 0 && total_bytes > config_.capacity_bytes) {
    const auto target = static_cast<int64_t>(config_.capacity_bytes * config_.capacity_low_watermark);
    std::sort(live.begin(), live.end(), [](const Entry& a, const Entry& b) { return a.access_ms < b.access_ms; });
    size_t i = 0;
    for (; i < live.size() && total_bytes > target; ++i) {
      if (::unlink(live[i].path.c_str()) == 0) {
        ++report.num_evicted;
        metrics_->num_evicted++;
      }
      total_bytes -= live[i].bytes;  // gone either way: we removed it or someone else did
    }
    live.erase(live.begin(), live.begin() + static_cast<long>(i));
  }
  report.num_objects = static_cast<int>(live.size());
  report.store_bytes = total_bytes;
  metrics_->store_bytes = total_bytes;
  metrics_->num_objects = report.num_objects;
  return report;
}

}  // namespace dsinfer::kv
