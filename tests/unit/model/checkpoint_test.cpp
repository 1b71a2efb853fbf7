#include "model/checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/safetensors_writer.h"
#include "model_test_util.h"

namespace dsinfer {
namespace {

using nlohmann::json;
using testing::ScratchDir;

void expect_open_error(const std::string& dir, std::initializer_list<std::string> needles) {
  try {
    Checkpoint::open(dir);
    FAIL() << "expected an error opening " << dir;
  } catch (const Error& e) {
    for (const std::string& n : needles) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << "\nmissing: " << n;
    }
  }
}

// Two shards: a.weight, b.weight in shard 1; c.weight in shard 2.
void write_sharded(const ScratchDir& dir) {
  SafetensorsWriter s1, s2;
  s1.add_f32("a.weight", {2}, {1, 2});
  s1.add_f32("b.weight", {1}, {3});
  s2.add_f32("c.weight", {3}, {4, 5, 6});
  s1.write(dir.file("model-00001-of-00002.safetensors"));
  s2.write(dir.file("model-00002-of-00002.safetensors"));
}

json sharded_index() {
  return json{{"metadata", {{"total_size", 24}}},
              {"weight_map",
               {{"a.weight", "model-00001-of-00002.safetensors"},
                {"b.weight", "model-00001-of-00002.safetensors"},
                {"c.weight", "model-00002-of-00002.safetensors"}}}};
}

TEST(CheckpointTest, OpensSingleFile) {
  ScratchDir dir;
  SafetensorsWriter w;
  w.add_f32("x", {2}, {1, 2});
  w.write(dir.file("model.safetensors"));
  auto ckpt = Checkpoint::open(dir.path());
  EXPECT_TRUE(ckpt->has("x"));
  EXPECT_FALSE(ckpt->has("y"));
  EXPECT_EQ(ckpt->get("x").shape, std::vector<int64_t>{2});
  EXPECT_EQ(ckpt->names(), std::vector<std::string>{"x"});
}

TEST(CheckpointTest, OpensShardsThroughIndex) {
  ScratchDir dir;
  write_sharded(dir);
  dir.write("model.safetensors.index.json", sharded_index().dump());
  std::vector<std::pair<size_t, size_t>> calls;
  auto ckpt = Checkpoint::open(dir.path(), [&](size_t done, size_t total) { calls.emplace_back(done, total); });
  EXPECT_EQ(ckpt->names(), (std::vector<std::string>{"a.weight", "b.weight", "c.weight"}));
  EXPECT_EQ(ckpt->get("c.weight").file, dir.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(ckpt->files().size(), 2u);
  // Progress starts at zero, grows and ends at the total.
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls.front().first, 0u);
  EXPECT_LT(calls[1].first, calls[2].first);
  EXPECT_EQ(calls.back().first, calls.back().second);
  EXPECT_EQ(calls.back().second, ckpt->total_bytes());
}

TEST(CheckpointTest, OpensShardsInNameOrder) {
  ScratchDir dir;
  SafetensorsWriter s1, s2;
  s1.add_f32("z.weight", {1}, {1});
  s2.add_f32("a.weight", {1}, {2});  // the first name the index lists lives in the second shard
  s1.write(dir.file("model-00001-of-00002.safetensors"));
  s2.write(dir.file("model-00002-of-00002.safetensors"));
  dir.write("model.safetensors.index.json",
            json{{"weight_map", {{"a.weight", "model-00002-of-00002.safetensors"},
                                 {"z.weight", "model-00001-of-00002.safetensors"}}}}
                .dump());
  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_EQ(ckpt->files().size(), 2u);
  EXPECT_EQ(ckpt->files()[0]->path(), dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(ckpt->get("a.weight").file, dir.file("model-00002-of-00002.safetensors"));
}

TEST(CheckpointTest, GetNamesTensorAndDirectory) {
  ScratchDir dir;
  SafetensorsWriter w;
  w.add_f32("x", {1}, {1});
  w.write(dir.file("model.safetensors"));
  auto ckpt = Checkpoint::open(dir.path());
  try {
    ckpt->get("model.norm.weight");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("model.norm.weight"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(dir.path()), std::string::npos);
  }
}

TEST(CheckpointTest, MissingShard) {
  ScratchDir dir;
  write_sharded(dir);
  json index = sharded_index();
  index["weight_map"]["d.weight"] = "model-00003-of-00003.safetensors";
  dir.write("model.safetensors.index.json", index.dump());
  expect_open_error(dir.path(), {"model.safetensors.index.json", "model-00003-of-00003.safetensors", "d.weight"});
}

TEST(CheckpointTest, TensorNotWhereTheMapSays) {
  ScratchDir dir;
  write_sharded(dir);
  json index = sharded_index();
  index["weight_map"]["c.weight"] = "model-00001-of-00002.safetensors";
  index["weight_map"]["extra"] = "model-00002-of-00002.safetensors";
  dir.write("model.safetensors.index.json", index.dump());
  expect_open_error(dir.path(), {"model-00002-of-00002.safetensors", "c.weight", "model-00001-of-00002.safetensors"});
}

TEST(CheckpointTest, MappedTensorAbsentFromShard) {
  ScratchDir dir;
  write_sharded(dir);
  json index = sharded_index();
  index["weight_map"]["ghost.weight"] = "model-00002-of-00002.safetensors";
  dir.write("model.safetensors.index.json", index.dump());
  expect_open_error(dir.path(), {"model.safetensors.index.json", "ghost.weight", "model-00002-of-00002.safetensors"});
}

TEST(CheckpointTest, ShardTensorNotInIndex) {
  ScratchDir dir;
  write_sharded(dir);
  json index = sharded_index();
  index["weight_map"].erase("b.weight");
  dir.write("model.safetensors.index.json", index.dump());
  expect_open_error(dir.path(), {"model-00001-of-00002.safetensors", "b.weight", "does not list"});
}

TEST(CheckpointTest, BadIndex) {
  ScratchDir dir;
  write_sharded(dir);
  dir.write("model.safetensors.index.json", "{\"weight_map\": ");
  expect_open_error(dir.path(), {"model.safetensors.index.json", "not valid JSON"});
  dir.write("model.safetensors.index.json", R"({"weight_map": {"a.weight": "../../etc/passwd"}})");
  expect_open_error(dir.path(), {"model.safetensors.index.json", "a.weight"});
  dir.write("model.safetensors.index.json", R"({"metadata": {}})");
  expect_open_error(dir.path(), {"model.safetensors.index.json", "weight_map"});
}

TEST(CheckpointTest, CorruptShardNamesFile) {
  ScratchDir dir;
  write_sharded(dir);
  dir.write("model-00002-of-00002.safetensors", "garbage!garbage!");
  dir.write("model.safetensors.index.json", sharded_index().dump());
  expect_open_error(dir.path(), {"model-00002-of-00002.safetensors"});
}

TEST(CheckpointTest, ShardsWithoutIndexMustNotCollide) {
  ScratchDir dir;
  write_sharded(dir);
  auto ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt->num_tensors(), 3u);
  SafetensorsWriter dup;
  dup.add_f32("a.weight", {1}, {9});
  dup.write(dir.file("model-extra.safetensors"));
  expect_open_error(dir.path(), {"a.weight", "also appears"});
}

TEST(CheckpointTest, EmptyOrMissingDirectory) {
  ScratchDir dir;
  expect_open_error(dir.path(), {dir.path(), "model.safetensors"});
  expect_open_error(dir.file("nope"), {dir.file("nope"), "not a directory"});
}

TEST(LoadProgressPrinterTest, FormatsGiB) {
  const size_t gib = size_t{1} << 30;
  EXPECT_EQ(LoadProgressPrinter::format_line("loading weights", gib / 2, 4 * gib),
            "loading weights: 0.5/4.0 GiB (12%)");
  EXPECT_EQ(LoadProgressPrinter::format_line("x", 0, 0), "x: 0.0/0.0 GiB (100%)");
}

TEST(LoadProgressPrinterTest, ThrottlesLargeLoads) {
  const size_t gib = size_t{1} << 30;
  double now = 100.0;
  LoadProgressPrinter printer("loading weights", [&] { return now; });
  ::testing::internal::CaptureStderr();
  printer(0, 8 * gib);
  // Calls 0.125 s apart: one line per 0.5 s, and the final call always prints.
  for (size_t i = 1; i < 8; ++i) {
    now += 0.125;  // exact in binary
    printer(i * gib, 8 * gib);
  }
  printer(8 * gib, 8 * gib);
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(printer.num_lines_printed(), 3);  // at t=100.0, t=100.5 (i=4) and the final one
  EXPECT_NE(out.find("4.0/8.0 GiB"), std::string::npos) << out;
  EXPECT_NE(out.find("8.0/8.0 GiB (100%)"), std::string::npos) << out;
}

}  // namespace
}  // namespace dsinfer
