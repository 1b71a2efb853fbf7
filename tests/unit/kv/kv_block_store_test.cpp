#include "kv/kv_block_store.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "temp_dir.h"

namespace dsinfer::kv {
namespace {

namespace fs = std::filesystem;

const std::string kIdentity = "test-model;block=64;bytes=1024";

using test_support::TempDir;

std::vector<TokenId> prefix_tokens(int n, int seed = 0) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), seed * 1000);
  return t;
}

StoreObject make_object(int unit, int seed = 0, size_t data_bytes = 4096, const std::string& cls = "chat") {
  StoreObject o;
  o.tokens = prefix_tokens(128 * (unit + 1), seed);
  BlockHash root = namespace_hash(kIdentity, "");
  auto keys = chain_hashes(root, o.tokens, 128, unit + 1);
  o.key = keys.back();
  o.parent_key = unit == 0 ? root : keys[unit - 1];
  o.model_identity = kIdentity;
  o.traffic_class = cls;
  o.data.resize(data_bytes);
  for (size_t i = 0; i < data_bytes; ++i) o.data[i] = static_cast<std::byte>((i * 31 + unit * 7 + seed) & 0xff);
  return o;
}

KvBlockStoreConfig test_config(const std::string& dir, std::shared_ptr<const KvClock> clock = nullptr) {
  KvBlockStoreConfig c;
  c.directory = dir;
  c.janitor_interval_ms = 0;  // tests run the janitor by hand
  c.clock = std::move(clock);
  return c;
}

bool same_data(const StoreRead& r, const StoreObject& o) {
  auto d = r.data();
  return d.size() == o.data.size() && std::equal(d.begin(), d.end(), o.data.begin());
}

std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path().string());
  return out;
}

TEST(KvBlockStore, WriteThenReadRoundTrips) {
  TempDir dir;
  KvBlockStore store(test_config(dir.path()));
  StoreObject o = make_object(2);
  ASSERT_TRUE(store.write_async(o));
  store.flush();
  EXPECT_TRUE(store.contains(o.key));
  auto r = store.read(o.key, kIdentity, o.tokens);
  ASSERT_EQ(r->outcome(), StoreReadOutcome::kHit) << store_read_outcome_name(r->outcome());
  EXPECT_TRUE(same_data(*r, o));
  EXPECT_EQ(r->header().traffic_class, "chat");
  EXPECT_EQ(r->header().parent_key, o.parent_key);
  EXPECT_GT(r->header().created_ms, 0);
  auto m = store.metrics();
  EXPECT_EQ(m.num_writes, 1);
  EXPECT_EQ(m.num_read_hits, 1);
  EXPECT_GT(m.bytes_written, 4096);
  EXPECT_EQ(m.bytes_read, m.bytes_written);
  // No temporary file is left behind.
  EXPECT_EQ(files_under(dir.path()).size(), 1u);
}

TEST(KvBlockStore, MissingObjectIsAMiss) {
  TempDir dir;
  KvBlockStore store(test_config(dir.path()));
  StoreObject o = make_object(0);
  auto r = store.read(o.key, kIdentity, o.tokens);
  EXPECT_EQ(r->outcome(), StoreReadOutcome::kMiss);
  EXPECT_EQ(store.metrics().num_read_misses, 1);
}

TEST(KvBlockStore, ManyConcurrentReadsAndWrites) {
  TempDir dir;
  KvBlockStoreConfig c = test_config(dir.path());
  c.io_queue_depth = 4;  // several batches
  c.num_io_threads = 2;
  KvBlockStore store(c);
  std::vector<StoreObject> objs;
  for (int i = 0; i < 20; ++i) objs.push_back(make_object(i % 5, i / 5, 1000 + 517 * i));
  for (auto& o : objs) ASSERT_TRUE(store.write_async(o));
  store.flush();
  std::vector<std::shared_ptr<StoreRead>> reads;
  for (auto& o : objs) reads.push_back(store.read_async(o.key, kIdentity, o.tokens));
  for (size_t i = 0; i < objs.size(); ++i) {
    reads[i]->wait();
    ASSERT_TRUE(reads[i]->hit()) << i;
    EXPECT_TRUE(same_data(*reads[i], objs[i])) << i;
  }
}

TEST(KvBlockStore, WorksWithoutIoUring) {
  TempDir dir;
  KvBlockStoreConfig c = test_config(dir.path());
  c.use_io_uring = false;
  KvBlockStore store(c);
  EXPECT_FALSE(store.using_io_uring());
  StoreObject o = make_object(1);
  store.write_async(o);
  store.flush();
  auto r = store.read(o.key, kIdentity, o.tokens);
  ASSERT_TRUE(r->hit());
  EXPECT_TRUE(same_data(*r, o));
}

TEST(KvBlockStore, UsesIoUringWhenTheKernelAllowsIt) {
  TempDir dir;
  KvBlockStore store(test_config(dir.path()));
  StoreObject o = make_object(0);
  store.write_async(o);
  store.flush();
  // The flag drops to false if ring setup failed; on this machine io_uring is available.
  EXPECT_TRUE(store.using_io_uring());
}

TEST(KvBlockStore, TokenMismatchIsAMissAndKeepsTheObject) {
  TempDir dir;
  KvBlockStore store(test_config(dir.path()));
  StoreObject o = make_object(1);
  store.write_async(o);
  store.flush();
  auto other = o.tokens;
  other[5] = -1;  // as if another prefix hashed to the same key
  EXPECT_EQ(store.read(o.key, kIdentity, other)->outcome(), StoreReadOutcome::kMismatch);
  EXPECT_TRUE(store.contains(o.key));
  EXPECT_TRUE(store.read(o.key, kIdentity, o.tokens)->hit());
}

TEST(KvBlockStore, ForeignIdentityIsRemoved) {
  TempDir dir;
  KvBlockStore store(test_config(dir.path()));
  StoreObject o = make_object(0);
  o.model_identity = "another-model";
  store.write_async(o);
  store.flush();
  EXPECT_EQ(store.read(o.key, kIdentity, o.tokens)->outcome(), StoreReadOutcome::kRemoved);
  EXPECT_FALSE(store.contains(o.key));
  EXPECT_EQ(store.metrics().num_removed_corrupt, 1);
}

// Modifying a file moves its mtime, which is where the store keeps the expiry; tests that
// damage a file put the times back so the read reaches the verification it is meant to test.
void copy_times(const std::string& from, const std::string& to) {
  struct stat st;
  ASSERT_EQ(::stat(from.c_str(), &st), 0);
  const timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, to.c_str(), times, 0), 0);
}

// Damages the object file of `o` with `damage` and expects the next read to remove it.
void expect_removed_after(const std::function<void(const std::string&)>& damage) {
  TempDir dir;
  KvBlockStore store(test_config(dir.path()));
  StoreObject o = make_object(3, 1, 10000);
  store.write_async(o);
  store.flush();
  const std::string path = store.object_path(o.key);
  const std::string times_ref = dir.path() + "/times";
  fs::copy_file(path, times_ref);
  copy_times(path, times_ref);
  damage(path);
  copy_times(times_ref, path);
  fs::remove(times_ref);
  auto r = store.read(o.key, kIdentity, o.tokens);
  EXPECT_EQ(r->outcome(), StoreReadOutcome::kRemoved) << store_read_outcome_name(r->outcome());
  EXPECT_FALSE(fs::exists(path));
  // A later write of the same key works again.
  store.write_async(o);
  store.flush();
  EXPECT_TRUE(store.read(o.key, kIdentity, o.tokens)->hit());
}

void flip_byte(const std::string& path, long offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset < 0 ? offset : offset, offset < 0 ? std::ios::end : std::ios::beg);
  char c;
  f.read(&c, 1);
  f.seekp(offset < 0 ? offset : offset, offset < 0 ? std::ios::end : std::ios::beg);
  c ^= 0x5a;
  f.write(&c, 1);
}

TEST(KvBlockStore, CorruptDataIsRemoved) {
  expect_removed_after([](const std::string& p) { flip_byte(p, -100); });
}

TEST(KvBlockStore, CorruptHeaderIsRemoved) {
  expect_removed_after([](const std::string& p) { flip_byte(p, 20); });
}

TEST(KvBlockStore, CorruptTokenIsRemoved) {
  // Tokens are covered by the checksum, so a flipped token is corruption, not a mismatch.
  expect_removed_after([](const std::string& p) { flip_byte(p, 88 + 40 + 8); });
}

TEST(KvBlockStore, BadMagicIsRemoved) {
  expect_removed_after([](const std::string& p) { flip_byte(p, 0); });
}

TEST(KvBlockStore, TruncatedObjectIsRemoved) {
  expect_removed_after([](const std::string& p) { fs::resize_file(p, fs::file_size(p) - 1); });
}

TEST(KvBlockStore, TruncatedToHeaderOnlyIsRemoved) {
  expect_removed_after([](const std::string& p) { fs::resize_file(p, 40); });
}

TEST(KvBlockStore, EmptyFileIsRemoved) {
  expect_removed_after([](const std::string& p) { fs::resize_file(p, 0); });
}

TEST(KvBlockStore, AppendedGarbageIsRemoved) {
  expect_removed_after([](const std::string& p) {
    std::ofstream f(p, std::ios::app | std::ios::binary);
    f << "garbage";
  });
}

TEST(KvBlockStore, ObjectUnderAnotherKeysNameIsRemoved) {
  TempDir dir;
  KvBlockStore store(test_config(dir.path()));
  StoreObject a = make_object(0, 1);
  StoreObject b = make_object(0, 2);
  store.write_async(a);
  store.flush();
  fs::create_directories(fs::path(store.object_path(b.key)).parent_path());
  fs::copy_file(store.object_path(a.key), store.object_path(b.key));
  copy_times(store.object_path(a.key), store.object_path(b.key));
  EXPECT_EQ(store.read(b.key, kIdentity, b.tokens)->outcome(), StoreReadOutcome::kRemoved);
  EXPECT_TRUE(store.read(a.key, kIdentity, a.tokens)->hit());
}

TEST(KvBlockStore, TtlPerTrafficClassWithInjectedClock) {
  TempDir dir;
  auto clock = std::make_shared<ManualKvClock>();
  KvBlockStore store(test_config(dir.path(), clock));
  StoreObject agent = make_object(0, 1, 1000, "agent");
  StoreObject chat = make_object(0, 2, 1000, "chat");
  StoreObject other = make_object(0, 3, 1000, "unknown-class");  // gets the default (chat)
  for (auto* o : {&agent, &chat, &other}) store.write_async(*o);
  store.flush();

  clock->advance_ms(3 * kMsPerDay - 60'000);
  JanitorReport r = store.run_janitor();
  EXPECT_EQ(r.num_expired, 0);
  EXPECT_EQ(r.num_objects, 3);

  clock->advance_ms(120'000);  // just past 3 days
  r = store.run_janitor();
  EXPECT_EQ(r.num_expired, 1);
  EXPECT_FALSE(store.contains(agent.key));
  EXPECT_TRUE(store.contains(chat.key));

  // A hit renews the TTL from the access time.
  clock->advance_ms(3 * kMsPerDay);  // 6 days after writing
  ASSERT_TRUE(store.read(chat.key, kIdentity, chat.tokens)->hit());
  clock->advance_ms(2 * kMsPerDay);  // 8 days after writing, 2 after the hit
  r = store.run_janitor();
  EXPECT_EQ(r.num_expired, 1);  // `other` expired; `chat` lives on
  EXPECT_TRUE(store.contains(chat.key));
  EXPECT_FALSE(store.contains(other.key));

  // A read of an expired object is a miss even before the janitor runs.
  clock->advance_ms(8 * kMsPerDay);
  EXPECT_EQ(store.read(chat.key, kIdentity, chat.tokens)->outcome(), StoreReadOutcome::kExpired);
  EXPECT_FALSE(store.contains(chat.key));
}

TEST(KvBlockStore, CapacityEvictsLeastRecentlyAccessed) {
  TempDir dir;
  auto clock = std::make_shared<ManualKvClock>();
  KvBlockStoreConfig c = test_config(dir.path(), clock);
  KvBlockStore probe(c);
  StoreObject sample = make_object(0, 0, 10000);
  probe.write_async(sample);
  probe.flush();
  const int64_t object_bytes = static_cast<int64_t>(fs::file_size(probe.object_path(sample.key)));
  fs::remove(probe.object_path(sample.key));

  c.capacity_bytes = 4 * object_bytes + object_bytes / 2;  // room for 4
  c.capacity_low_watermark = 1.0;
  KvBlockStore store(c);
  std::vector<StoreObject> objs;
  for (int i = 0; i < 6; ++i) {
    objs.push_back(make_object(0, 10 + i, 10000));
    store.write_async(objs.back());
    store.flush();
    clock->advance_ms(1000);
  }
  // Touch the two oldest: now objects 2 and 3 are the least recently accessed.
  ASSERT_TRUE(store.read(objs[0].key, kIdentity, objs[0].tokens)->hit());
  clock->advance_ms(1000);
  ASSERT_TRUE(store.read(objs[1].key, kIdentity, objs[1].tokens)->hit());
  JanitorReport r = store.run_janitor();
  EXPECT_EQ(r.num_evicted, 2);
  EXPECT_EQ(r.num_objects, 4);
  EXPECT_LE(r.store_bytes, c.capacity_bytes);
  EXPECT_TRUE(store.contains(objs[0].key));
  EXPECT_TRUE(store.contains(objs[1].key));
  EXPECT_FALSE(store.contains(objs[2].key));
  EXPECT_FALSE(store.contains(objs[3].key));
  EXPECT_TRUE(store.contains(objs[4].key));
  EXPECT_TRUE(store.contains(objs[5].key));
  EXPECT_EQ(store.metrics().store_bytes, r.store_bytes);
}

TEST(KvBlockStore, JanitorRemovesStaleTempFilesOnly) {
  TempDir dir;
  auto clock = std::make_shared<ManualKvClock>();
  KvBlockStore store(test_config(dir.path(), clock));
  StoreObject o = make_object(0);
  store.write_async(o);
  store.flush();
  // Torn writes from crashed writers: a partial temporary file next to the objects, and one whose
  // writer died after setting its times (the object's expiry as its mtime, days ahead) but before
  // the rename.
  const std::string folder = fs::path(store.object_path(o.key)).parent_path().string();
  const std::string temp = folder + "/.tmp-" + o.key.to_hex() + "-99999-0";
  const std::string timed_temp = folder + "/.tmp-" + o.key.to_hex() + "-99999-1";
  for (const std::string& path : {temp, timed_temp}) {
    std::ofstream f(path, std::ios::binary);
    f << "DSKVOBJ1 partial";
  }
  const int64_t expiry_ms = clock->now_ms() + 3 * 24 * 3'600'000LL;
  const timespec times[2] = {{clock->now_ms() / 1000, 0}, {expiry_ms / 1000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, timed_temp.c_str(), times, 0), 0);
  EXPECT_EQ(store.run_janitor().num_stale_temps, 0);  // might still be written
  EXPECT_TRUE(fs::exists(temp));
  EXPECT_TRUE(fs::exists(timed_temp));
  EXPECT_TRUE(store.read(o.key, kIdentity, o.tokens)->hit());  // never visible to readers
  clock->advance_ms(11 * 60'000);
  JanitorReport r = store.run_janitor();
  EXPECT_EQ(r.num_stale_temps, 2);
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_FALSE(fs::exists(timed_temp));
  EXPECT_EQ(r.num_objects, 1);
}

TEST(KvBlockStore, SurvivesRestart) {
  TempDir dir;
  StoreObject o = make_object(4, 2, 5000, "agent");
  {
    KvBlockStore store(test_config(dir.path()));
    store.write_async(o);
  }  // destruction finishes queued writes
  KvBlockStore store(test_config(dir.path()));
  auto r = store.read(o.key, kIdentity, o.tokens);
  ASSERT_TRUE(r->hit());
  EXPECT_TRUE(same_data(*r, o));
  EXPECT_EQ(r->header().traffic_class, "agent");
  EXPECT_EQ(store.run_janitor().num_objects, 1);
}

TEST(KvBlockStore, WritesBeyondTheQueueBoundAreDropped) {
  TempDir dir;
  KvBlockStoreConfig c = test_config(dir.path());
  c.max_queued_write_bytes = 1;  // only one write may wait at a time
  KvBlockStore store(c);
  int num_accepted = 0;
  for (int i = 0; i < 50; ++i) num_accepted += store.write_async(make_object(0, i, 1 << 16));
  store.flush();
  auto m = store.metrics();
  EXPECT_EQ(m.num_writes, num_accepted);
  EXPECT_EQ(m.num_writes_dropped, 50 - num_accepted);
  EXPECT_GE(num_accepted, 1);
}

TEST(KvBlockStore, TwoStoresOnOneDirectoryShareObjects) {
  TempDir dir;
  KvBlockStore a(test_config(dir.path()));
  KvBlockStore b(test_config(dir.path()));
  // Both write the same keys (same content) and distinct keys concurrently, while each reads
  // what the other wrote. Every read is either a miss (not there yet) or the exact data.
  std::vector<StoreObject> shared, only_a, only_b;
  for (int i = 0; i < 12; ++i) {
    shared.push_back(make_object(i % 4, 100 + i / 4, 20000));
    only_a.push_back(make_object(i % 4, 200 + i / 4, 20000));
    only_b.push_back(make_object(i % 4, 300 + i / 4, 20000));
  }
  std::atomic<int> num_bad{0};
  auto worker = [&](KvBlockStore& self, std::vector<StoreObject>& mine, std::vector<StoreObject>& theirs) {
    for (int round = 0; round < 5; ++round) {
      for (size_t i = 0; i < mine.size(); ++i) {
        self.write_async(shared[i]);
        self.write_async(mine[i]);
        auto r = self.read(theirs[i].key, kIdentity, theirs[i].tokens);
        if (r->hit() && !same_data(*r, theirs[i])) ++num_bad;
        if (!r->hit() && r->outcome() != StoreReadOutcome::kMiss) ++num_bad;
        auto s = self.read(shared[i].key, kIdentity, shared[i].tokens);
        if (s->hit() && !same_data(*s, shared[i])) ++num_bad;
        if (!s->hit() && s->outcome() != StoreReadOutcome::kMiss) ++num_bad;
      }
    }
    self.flush();
  };
  std::thread ta(worker, std::ref(a), std::ref(only_a), std::ref(only_b));
  std::thread tb(worker, std::ref(b), std::ref(only_b), std::ref(only_a));
  ta.join();
  tb.join();
  EXPECT_EQ(num_bad.load(), 0);
  for (auto* set : {&shared, &only_a, &only_b})
    for (auto& o : *set) {
      auto r = b.read(o.key, kIdentity, o.tokens);
      ASSERT_TRUE(r->hit());
      EXPECT_TRUE(same_data(*r, o));
    }
  // No temporary files remain and nothing was removed as corrupt.
  for (auto& f : files_under(dir.path())) EXPECT_EQ(f.find(".tmp-"), std::string::npos) << f;
  EXPECT_EQ(a.metrics().num_removed_corrupt + b.metrics().num_removed_corrupt, 0);
}

TEST(KvBlockStore, KilledWriterLeavesNoCorruptObject) {
  TempDir dir;
  std::vector<StoreObject> objs;
  for (int i = 0; i < 64; ++i) objs.push_back(make_object(i % 8, i / 8, 256 * 1024));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child writes forever with several objects in flight until it is killed.
    KvBlockStoreConfig c = test_config(dir.path());
    c.io_queue_depth = 8;
    KvBlockStore store(c);
    for (;;)
      for (auto& o : objs) store.write_async(o);
  }
  // Kill it once some objects exist, i.e. while it is in the middle of writing more.
  const std::string sub_probe = dir.path();
  for (int spins = 0; spins < 20000; ++spins) {
    int n = 0;
    for (auto& e : fs::recursive_directory_iterator(sub_probe))
      n += e.path().extension() == ".kvb";
    if (n >= 8) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));

  auto clock = std::make_shared<ManualKvClock>();
  KvBlockStore store(test_config(dir.path(), clock));
  int num_hits = 0;
  for (auto& o : objs) {
    auto r = store.read(o.key, kIdentity, o.tokens);
    ASSERT_TRUE(r->outcome() == StoreReadOutcome::kHit || r->outcome() == StoreReadOutcome::kMiss)
        << store_read_outcome_name(r->outcome());
    if (r->hit()) {
      EXPECT_TRUE(same_data(*r, o));
      ++num_hits;
    }
  }
  EXPECT_GE(num_hits, 8);
  EXPECT_EQ(store.metrics().num_removed_corrupt, 0);
  // Whatever the killed writer left half-written is cleaned up once it is old enough.
  clock->advance_ms(11 * 60'000);
  store.run_janitor();
  for (auto& f : files_under(dir.path())) EXPECT_EQ(f.find(".tmp-"), std::string::npos) << f;
}

}  // namespace
}  // namespace dsinfer::kv
