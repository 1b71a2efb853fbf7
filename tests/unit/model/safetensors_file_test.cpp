#include "model/safetensors.h"

#include <sys/stat.h>

#include <cstring>

#include <gtest/gtest.h>

#include "core/status.h"
#include "model/safetensors_writer.h"
#include "model_test_util.h"

namespace dsinfer {
namespace {

using testing::ScratchDir;

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file from a raw header and a data section.
std::string raw_file(const std::string& header, size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\x07');
}

// Expects open() to throw Error of `code` whose message contains every needle.
void expect_open_error(const std::string& path, StatusCode code, std::initializer_list<std::string> needles) {
  try {
    SafetensorsFile::open(path);
    FAIL() << "expected an error opening " << path;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << "\nmissing: " << n;
  }
}

SafetensorsWriter two_tensor_writer() {
  SafetensorsWriter w;
  w.add_f32("a.weight", {2, 3}, {1, 2, 3, 4, 5, 6});
  const uint16_t bf[4] = {f32_to_bf16(1.5f), f32_to_bf16(-2.0f), f32_to_bf16(0.25f), f32_to_bf16(8.0f)};
  w.add("b.weight", DType::kBF16, {4}, bf, sizeof(bf));
  const uint8_t f8[2] = {f32_to_fp8e4m3(1.0f), f32_to_fp8e4m3(-0.5f)};
  w.add("c.weight", DType::kF8E4M3, {1, 2}, f8, sizeof(f8));
  const int64_t ids[1] = {42};
  w.add("d.ids", DType::kI64, {1}, ids, sizeof(ids));
  w.add_zeros("e.empty", DType::kF32, {0, 5});
  w.set_metadata("format", "pt");
  return w;
}

TEST(SafetensorsFileTest, RoundTripsWrittenFile) {
  ScratchDir dir;
  two_tensor_writer().write(dir.file("m.safetensors"));
  auto f = SafetensorsFile::open(dir.file("m.safetensors"));
  ASSERT_EQ(f->tensors().size(), 5u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->data_offset_bytes() % 8, 0u);

  const TensorInfo* a = f->find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->num_elements(), 6);
  EXPECT_EQ(a->num_bytes, 24u);
  EXPECT_EQ(a->file, dir.file("m.safetensors"));
  float values[6];
  std::memcpy(values, a->data, sizeof(values));
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[5], 6.0f);

  const TensorInfo* b = f->find("b.weight");
  ASSERT_NE(b, nullptr);
  float bf[4];
  convert_to_f32(DType::kBF16, b->data, bf, 4);
  EXPECT_EQ(bf[0], 1.5f);
  EXPECT_EQ(bf[3], 8.0f);

  const TensorInfo* c = f->find("c.weight");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dtype, DType::kF8E4M3);
  EXPECT_EQ(fp8e4m3_to_f32(c->data[1]), -0.5f);

  const TensorInfo* d = f->find("d.ids");
  ASSERT_NE(d, nullptr);
  int64_t id;
  std::memcpy(&id, d->data, 8);
  EXPECT_EQ(id, 42);

  const TensorInfo* e = f->find("e.empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->num_bytes, 0u);
  EXPECT_EQ(f->find("nope"), nullptr);
  // Tensors come back in data order.
  EXPECT_EQ(f->tensors().front().name, "a.weight");
}

TEST(SafetensorsFileTest, FromMemoryMatchesSerializedImage) {
  const std::string image = two_tensor_writer().serialize();
  auto f = SafetensorsFile::from_memory(reinterpret_cast<const uint8_t*>(image.data()), image.size(), "mem");
  EXPECT_EQ(f->tensors().size(), 5u);
  EXPECT_EQ(f->find("a.weight")->data, reinterpret_cast<const uint8_t*>(image.data()) + f->data_offset_bytes());
}

TEST(SafetensorsFileTest, MissingFileIsNotFound) {
  ScratchDir dir;
  expect_open_error(dir.file("absent.safetensors"), StatusCode::kNotFound, {"absent.safetensors"});
}

TEST(SafetensorsFileTest, DirectoryAndFifoAreRejected) {
  ScratchDir dir;
  expect_open_error(dir.path(), StatusCode::kDataLoss, {dir.path(), "not a regular file"});
  ASSERT_EQ(mkfifo(dir.file("pipe.safetensors").c_str(), 0600), 0);
  expect_open_error(dir.file("pipe.safetensors"), StatusCode::kDataLoss, {"pipe.safetensors", "not a regular file"});
}

TEST(SafetensorsFileTest, FileShorterThanLengthPrefix) {
  ScratchDir dir;
  dir.write("short.safetensors", "abc");
  expect_open_error(dir.file("short.safetensors"), StatusCode::kDataLoss, {"short.safetensors", "truncated"});
  dir.write("empty.safetensors", "");
  expect_open_error(dir.file("empty.safetensors"), StatusCode::kDataLoss, {"empty.safetensors", "truncated"});
}

TEST(SafetensorsFileTest, TruncatedDataSection) {
  ScratchDir dir;
  std::string image = two_tensor_writer().serialize();
  dir.write("cut.safetensors", image.substr(0, image.size() - 3));
  // The last tensor in data order ends past the shortened data section.
  expect_open_error(dir.file("cut.safetensors"), StatusCode::kDataLoss, {"cut.safetensors", "tensor \"d.ids\"", "run past"});
}

TEST(SafetensorsFileTest, HeaderLengthBeyondFile) {
  ScratchDir dir;
  dir.write("big.safetensors", le64(1000) + "{}");
  expect_open_error(dir.file("big.safetensors"), StatusCode::kDataLoss, {"big.safetensors", "header length 1000"});
  dir.write("huge.safetensors", le64(~0ull) + "{}");
  expect_open_error(dir.file("huge.safetensors"), StatusCode::kDataLoss, {"huge.safetensors", "header length"});
}

TEST(SafetensorsFileTest, BadJsonHeader) {
  ScratchDir dir;
  dir.write("bad.safetensors", raw_file("{\"a\": {\"dtype\": \"F32\",", 0));
  expect_open_error(dir.file("bad.safetensors"), StatusCode::kDataLoss, {"bad.safetensors", "not valid JSON"});
  dir.write("notobj.safetensors", raw_file("[1, 2]", 0));
  expect_open_error(dir.file("notobj.safetensors"), StatusCode::kDataLoss, {"notobj.safetensors"});
  dir.write("deep.safetensors", raw_file("{\"a\":" + std::string(5000, '[') + std::string(5000, ']') + "}", 0));
  expect_open_error(dir.file("deep.safetensors"), StatusCode::kDataLoss, {"deep.safetensors", "nested"});
  dir.write("entry.safetensors", raw_file("{\"a\": 3}", 0));
  expect_open_error(dir.file("entry.safetensors"), StatusCode::kDataLoss, {"entry.safetensors", "\"a\""});
  dir.write("meta.safetensors", raw_file("{\"__metadata__\": {\"k\": 1}}", 0));
  expect_open_error(dir.file("meta.safetensors"), StatusCode::kDataLoss, {"meta.safetensors", "__metadata__"});
}

TEST(SafetensorsFileTest, OffsetsOutOfRange) {
  ScratchDir dir;
  dir.write("oor.safetensors",
            raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", 12));
  expect_open_error(dir.file("oor.safetensors"), StatusCode::kDataLoss, {"oor.safetensors", "tensor \"w\"", "run past"});
  dir.write("rev.safetensors",
            raw_file(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 12));
  expect_open_error(dir.file("rev.safetensors"), StatusCode::kDataLoss, {"rev.safetensors", "tensor \"w\""});
  dir.write("neg.safetensors",
            raw_file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 12));
  expect_open_error(dir.file("neg.safetensors"), StatusCode::kDataLoss, {"neg.safetensors", "tensor \"w\""});
}

TEST(SafetensorsFileTest, OverlappingTensors) {
  ScratchDir dir;
  dir.write("ov.safetensors", raw_file(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                          "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                       16));
  expect_open_error(dir.file("ov.safetensors"), StatusCode::kDataLoss, {"ov.safetensors", "tensor \"y\"", "overlaps tensor \"x\""});
}

TEST(SafetensorsFileTest, OffsetsInconsistentWithShape) {
  ScratchDir dir;
  dir.write("sz.safetensors",
            raw_file(R"({"w": {"dtype": "BF16", "shape": [3, 2], "data_offsets": [0, 8]}})", 16));
  expect_open_error(dir.file("sz.safetensors"), StatusCode::kDataLoss, {"sz.safetensors", "tensor \"w\"", "needs 12"});
  dir.write("ovf.safetensors",
            raw_file(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 0]}})", 0));
  expect_open_error(dir.file("ovf.safetensors"), StatusCode::kDataLoss, {"ovf.safetensors", "tensor \"w\"", "overflows"});
  dir.write("neg.safetensors",
            raw_file(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})", 0));
  expect_open_error(dir.file("neg.safetensors"), StatusCode::kDataLoss, {"neg.safetensors", "tensor \"w\""});
}

TEST(SafetensorsFileTest, UnknownDtype) {
  ScratchDir dir;
  dir.write("dt.safetensors",
            raw_file(R"({"w": {"dtype": "F8_E5M2X", "shape": [1], "data_offsets": [0, 1]}})", 1));
  expect_open_error(dir.file("dt.safetensors"), StatusCode::kDataLoss, {"dt.safetensors", "tensor \"w\"", "F8_E5M2X"});
  dir.write("nodt.safetensors", raw_file(R"({"w": {"shape": [1], "data_offsets": [0, 1]}})", 1));
  expect_open_error(dir.file("nodt.safetensors"), StatusCode::kDataLoss, {"nodt.safetensors", "tensor \"w\"", "dtype"});
}

TEST(SafetensorsFileTest, AcceptsPaddingAndGaps) {
  // Trailing spaces pad headers in files written by the reference library.
  ScratchDir dir;
  dir.write("pad.safetensors",
            raw_file(std::string(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})") + "      ", 4));
  auto f = SafetensorsFile::open(dir.file("pad.safetensors"));
  ASSERT_EQ(f->tensors().size(), 1u);
  EXPECT_EQ(f->tensors()[0].data[0], 7);
}

TEST(SafetensorsWriterTest, SparseZerosReadBackAsZeros) {
  ScratchDir dir;
  SafetensorsWriter w;
  w.add_zeros("z", DType::kBF16, {1024, 64});
  w.add_f32("tail", {1}, {3.0f});
  w.write(dir.file("z.safetensors"));
  auto f = SafetensorsFile::open(dir.file("z.safetensors"));
  const TensorInfo* z = f->find("z");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z->num_bytes, 1024u * 64 * 2);
  size_t nonzero = 0;
  for (size_t i = 0; i < z->num_bytes; ++i) nonzero += z->data[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  float tail;
  std::memcpy(&tail, f->find("tail")->data, 4);
  EXPECT_EQ(tail, 3.0f);
}

}  // namespace
}  // namespace dsinfer
