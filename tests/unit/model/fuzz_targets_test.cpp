// Replays random mutations of valid inputs through the libFuzzer entry points in fuzz/, so the
// normal build exercises them even where clang/libFuzzer is not available.
#include <cstring>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "core/status.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "model_test_util.h"

#define LLVMFuzzerTestOneInput fuzz_safetensors_one_input
#include "../../../fuzz/fuzz_safetensors.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_model_config_one_input
#include "../../../fuzz/fuzz_model_config.cpp"
#undef LLVMFuzzerTestOneInput

namespace dsinfer {
namespace {

// One random edit of the kinds a fuzzer makes: flip a bit, overwrite a byte with an
// interesting value, truncate, duplicate a span, or retarget a digit in the JSON header.
std::string mutate(std::string s, std::mt19937& rng) {
  static const char kInteresting[] = {'\0', '\xff', '[', ']', '{', '}', '"', ',', ':', '-', '9', '0', ' '};
  auto pick = [&](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  const int num_edits = 1 + static_cast<int>(rng() % 3);
  for (int e = 0; e < num_edits && !s.empty(); ++e) {
    switch (rng() % 6) {
      case 0: s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8)); break;
      case 1: s[pick(s.size())] = kInteresting[pick(sizeof(kInteresting))]; break;
      case 2: s.resize(pick(s.size())); break;
      case 3: {
        const size_t at = pick(s.size()), len = pick(std::min<size_t>(32, s.size() - at));
        s.insert(pick(s.size()), s.substr(at, len));
        break;
      }
      case 4: {  // change a digit inside the header (offsets, shapes, the length prefix)
        for (int tries = 0; tries < 16; ++tries) {
          const size_t at = pick(std::min<size_t>(s.size(), 400));
          if (s[at] >= '0' && s[at] <= '9') {
            s[at] = static_cast<char>('0' + rng() % 10);
            break;
          }
        }
        break;
      }
      default: s[pick(std::min<size_t>(s.size(), 8))] = static_cast<char>(rng()); break;  // length prefix
    }
  }
  return s;
}

std::string valid_safetensors() {
  SafetensorsWriter w;
  w.add_f32("model.norm.weight", {4}, {1, 2, 3, 4});
  w.add_zeros("model.layers.0.mlp.up_proj.weight", DType::kF8E4M3, {3, 5});
  w.add_f32("model.layers.0.mlp.up_proj.weight_scale_inv", {1, 1}, {0.5f});
  w.add_zeros("lm_head.weight", DType::kBF16, {2, 3});
  w.set_metadata("format", "pt");
  return w.serialize();
}

TEST(FuzzTargetsTest, SafetensorsMutationsParseOrFailCleanly) {
  const std::string seed = valid_safetensors();
  std::mt19937 rng(1234);
  int num_accepted = 0, num_rejected = 0;
  for (int i = 0; i < 600; ++i) {
    const std::string input = mutate(seed, rng);
    const auto* bytes = reinterpret_cast<const uint8_t*>(input.data());
    EXPECT_EQ(fuzz_safetensors_one_input(bytes, input.size()), 0);
    // The contract the target relies on, checked here directly.
    try {
      auto f = SafetensorsFile::from_memory(bytes, input.size(), "m");
      ++num_accepted;
      const uint8_t* prev_end = nullptr;
      for (const TensorInfo& t : f->tensors()) {
        ASSERT_GE(t.data, bytes + f->data_offset_bytes());
        ASSERT_LE(t.data + t.num_bytes, bytes + input.size());
        ASSERT_EQ(t.num_bytes, static_cast<size_t>(t.num_elements()) * dtype_size_bytes(t.dtype));
        if (t.num_bytes > 0) {
          if (prev_end != nullptr) {
            ASSERT_GE(t.data, prev_end) << t.name;
          }
          prev_end = t.data + t.num_bytes;
        }
      }
    } catch (const Error& e) {
      ++num_rejected;
      EXPECT_NE(std::string(e.what()).find("m:"), std::string::npos) << e.what();
    }
  }
  // Both outcomes occur, so the mutations reach past the first check.
  EXPECT_GT(num_accepted, 0);
  EXPECT_GT(num_rejected, 0);
}

TEST(FuzzTargetsTest, ConfigMutationsParseOrFailCleanly) {
  const std::string seed = testing::tiny_v3_config_json().dump();
  std::mt19937 rng(99);
  int num_accepted = 0;
  for (int i = 0; i < 600; ++i) {
    const std::string input = mutate(seed, rng);
    EXPECT_EQ(fuzz_model_config_one_input(reinterpret_cast<const uint8_t*>(input.data()), input.size()), 0);
    nlohmann::json j = nlohmann::json::parse(input, nullptr, false);
    if (j.is_discarded()) continue;
    try {
      ModelConfig::from_json(j, "c");
      ++num_accepted;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(num_accepted, 0);
}

}  // namespace
}  // namespace dsinfer
