// Block-store throughput against the disk it sits on, measured in the same run on the same
// directory:
//   raw sequential read  – one file of the same total size, read with 1 MiB read() calls (dd)
//   raw sequential write – the same file written with 1 MiB write() calls, then fdatasync
//   store write          – write_async of every object, then flush (synced, and page cache only)
//   store read           – read_async of every object (full verification), then wait
// Cold reads drop each file from the page cache first (fdatasync + POSIX_FADV_DONTNEED on our
// own files only), so they measure the disk; warm reads measure the store's own overhead.
//
// usage: bench_kv_store [--dir DIR] [--total-mib N] [--object-kib K] [--repeats N] [--no-io-uring]
//                       [--append RESULTS.md]
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kv/kv_block_store.h"

namespace {

using dsinfer::TokenId;
using namespace dsinfer::kv;
namespace fs = std::filesystem;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Writes back and evicts `path` from the page cache, so the next read comes from the disk.
void drop_from_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_tree_from_cache(const std::string& dir) {
  for (auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) drop_from_cache(e.path().string());
}

double raw_sequential_read_gbps(const std::string& path, size_t bytes) {
  std::vector<char> buf(1 << 20);
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  auto t0 = std::chrono::steady_clock::now();
  size_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n <= 0) break;
    total += static_cast<size_t>(n);
  }
  const double s = seconds_since(t0);
  ::close(fd);
  if (total != bytes) std::fprintf(stderr, "raw read: short file (%zu of %zu)\n", total, bytes);
  return total / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  std::string append_path;
  size_t total_mib = 512;
  bool use_io_uring = true;
  int repeats = 3;
  size_t object_kib = 3888;  // one 128-token unit of DeepSeek-V2-Lite: 27 layers x 576 x bf16
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--dir") dir = next();
    else if (a == "--total-mib") total_mib = std::stoul(next());
    else if (a == "--object-kib") object_kib = std::stoul(next());
    else if (a == "--append") append_path = next();
    else if (a == "--no-io-uring") use_io_uring = false;
    else if (a == "--repeats") repeats = std::max(1, std::stoi(next()));
    else {
      std::fprintf(stderr, "usage: %s [--dir DIR] [--total-mib N] [--object-kib K] [--repeats N] [--no-io-uring] [--append FILE]\n", argv[0]);
      return 2;
    }
  }
  bool own_dir = false;
  if (dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "dsinfer-kv-bench-XXXXXX").string();
    dir = ::mkdtemp(tmpl.data());
    own_dir = true;
  }
  const size_t object_bytes = object_kib * 1024;
  const int num_objects = static_cast<int>(std::max<size_t>(1, total_mib * 1024 * 1024 / object_bytes));
  const size_t total_bytes = static_cast<size_t>(num_objects) * object_bytes;
  const std::string identity = "bench-model;block_tokens=64;block_bytes=" + std::to_string(object_bytes / 2);
  const int unit_tokens = 128;

  // Objects: unit u of prompt p. Token ids of the whole prefix are in each header.
  std::vector<StoreObject> objects(num_objects);
  for (int i = 0; i < num_objects; ++i) {
    StoreObject& o = objects[i];
    o.tokens.resize(unit_tokens);
    for (int t = 0; t < unit_tokens; ++t) o.tokens[t] = i * 1000 + t;
    o.key = chain_hash(namespace_hash(identity, ""), o.tokens);
    o.model_identity = identity;
    o.traffic_class = "chat";
    o.data.resize(object_bytes);
    for (size_t b = 0; b < object_bytes; b += 8) {
      uint64_t v = (static_cast<uint64_t>(i) << 32) ^ (b * 0x9e3779b97f4a7c15ULL);
      std::memcpy(o.data.data() + b, &v, std::min<size_t>(8, object_bytes - b));
    }
  }

  KvBlockStoreConfig config;
  config.directory = dir + "/store";
  config.janitor_interval_ms = 0;
  config.use_io_uring = use_io_uring;
  config.max_queued_write_bytes = static_cast<int64_t>(total_bytes) + 1;
  auto run_reads = [&](KvBlockStore& store) {
    std::vector<std::shared_ptr<StoreRead>> reads;
    reads.reserve(objects.size());
    auto t0 = std::chrono::steady_clock::now();
    for (const StoreObject& o : objects) reads.push_back(store.read_async(o.key, identity, o.tokens));
    int hits = 0;
    for (auto& r : reads) {
      r->wait();
      hits += r->hit();
    }
    const double s = seconds_since(t0);
    if (hits != num_objects) std::fprintf(stderr, "store read: %d of %d hits\n", hits, num_objects);
    return total_bytes / s / 1e9;
  };
  auto run_writes = [&](bool sync) {
    fs::remove_all(config.directory);
    KvBlockStoreConfig c = config;
    c.sync_writes = sync;
    KvBlockStore store(c);
    std::vector<StoreObject> copies = objects;  // write_async takes its object; copy outside the clock
    auto t0 = std::chrono::steady_clock::now();
    for (StoreObject& o : copies) store.write_async(std::move(o));
    store.flush();
    return total_bytes / seconds_since(t0) / 1e9;
  };

  // The machine is shared and noisy: every measurement is taken `repeats` times, interleaved,
  // and the median is reported.
  enum { kRawWrite, kRawReadCold, kRawReadWarm, kStoreWrite, kStoreWriteSync, kStoreReadCold, kStoreReadWarm, kNum };
  std::vector<std::vector<double>> runs(kNum);
  bool uring = false;
  const std::string raw_path = dir + "/raw-sequential.bin";
  // One reading store for all repeats, as in a running server: its buffer pool is warm after
  // the first pass (the first pass pays for allocating and faulting in its buffers).
  fs::create_directories(config.directory);
  auto reader = std::make_unique<KvBlockStore>(config);
  for (int rep = 0; rep < repeats; ++rep) {
    {  // The disk's own sequential rates on this directory (dd: 1 MiB write()/read() calls).
      std::vector<char> chunk(1 << 20, 'x');
      int fd = ::open(raw_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      auto t0 = std::chrono::steady_clock::now();
      for (size_t w = 0; w < total_bytes; w += chunk.size())
        if (::write(fd, chunk.data(), std::min(chunk.size(), total_bytes - w)) < 0) break;
      ::fdatasync(fd);
      runs[kRawWrite].push_back(total_bytes / seconds_since(t0) / 1e9);
      ::close(fd);
    }
    drop_from_cache(raw_path);
    runs[kRawReadCold].push_back(raw_sequential_read_gbps(raw_path, total_bytes));
    runs[kRawReadWarm].push_back(raw_sequential_read_gbps(raw_path, total_bytes));
    fs::remove(raw_path);
    runs[kStoreWrite].push_back(run_writes(false));
    runs[kStoreWriteSync].push_back(run_writes(true));
    drop_tree_from_cache(config.directory);
    runs[kStoreReadCold].push_back(run_reads(*reader));
    runs[kStoreReadWarm].push_back(run_reads(*reader));
    uring = reader->using_io_uring();
  }
  auto median = [&](int k) {
    std::vector<double> v = runs[k];
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double raw_write = median(kRawWrite), raw_cold = median(kRawReadCold), raw_warm = median(kRawReadWarm);
  const double write_gbps = median(kStoreWrite), write_sync_gbps = median(kStoreWriteSync);
  const double read_cold = median(kStoreReadCold), read_warm = median(kStoreReadWarm);
  reader.reset();
  if (own_dir) fs::remove_all(dir);
  else fs::remove_all(config.directory);

  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  std::ostringstream out;
  out << "\n## KV block store throughput (" << date << ")\n\n"
      << "Machine: dev box: 2-core x86-64, Debian 12. Command: `build/bench_kv_store";
  for (int i = 1; i < argc; ++i) out << " " << argv[i];
  out << "`\n\n"
      << num_objects << " objects of " << object_kib << " KiB (" << total_bytes / (1024 * 1024)
      << " MiB), one I/O thread, " << (uring ? "io_uring" : "pread/pwrite") << ", queue depth "
      << config.io_queue_depth << ". Cold = files dropped from the page cache first (fdatasync + "
      << "POSIX_FADV_DONTNEED per file). The machine is shared and its load varies by the second: "
      << "each figure is the median of interleaved repeats.\n\n";
  char line[256];
  out << "| measurement (median of " << repeats << ") | GB/s | ratio to the raw disk rate |\n|---|---:|---:|\n";
  std::snprintf(line, sizeof(line), "| raw sequential read, cold (1 MiB read()) | %.2f | 1.00 |\n", raw_cold);
  out << line;
  std::snprintf(line, sizeof(line), "| raw sequential read, warm | %.2f | 1.00 |\n", raw_warm);
  out << line;
  std::snprintf(line, sizeof(line), "| store read, cold (verified) | %.2f | %.2f |\n", read_cold, read_cold / raw_cold);
  out << line;
  std::snprintf(line, sizeof(line), "| store read, warm (verified) | %.2f | %.2f |\n", read_warm, read_warm / raw_warm);
  out << line;
  std::snprintf(line, sizeof(line), "| raw sequential write + fdatasync (1 MiB write()) | %.2f | 1.00 |\n", raw_write);
  out << line;
  std::snprintf(line, sizeof(line), "| store write, fdatasync per object | %.2f | %.2f of raw write |\n",
                write_sync_gbps, write_sync_gbps / raw_write);
  out << line;
  std::snprintf(line, sizeof(line), "| store write, page cache only (default) | %.2f | %.2f of raw write |\n",
                write_gbps, write_gbps / raw_write);
  out << line;
  std::fputs(out.str().c_str(), stdout);
  if (!append_path.empty()) {
    const bool exists = fs::exists(append_path);
    std::ofstream f(append_path, std::ios::app);
    if (!exists) f << "# dsinfer benchmark results\n";
    f << out.str();
  }
  return 0;
}
