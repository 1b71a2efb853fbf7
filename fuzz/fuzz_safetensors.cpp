// libFuzzer target: safetensors header parsing and validation.
//
// Any input must end in either a parsed file whose tensors lie inside the input, or a
// dsinfer::Error; anything else (a crash, another exception, an out-of-bounds read under
// ASan) is a bug. tests/unit/model/fuzz_targets_test.cpp replays mutations of a valid file
// through this same entry point under the normal build.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/status.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto file = dsinfer::SafetensorsFile::from_memory(data, size, "fuzz.safetensors");
    // Touch both ends of every tensor so ASan sees any range outside the input.
    unsigned sink = 0;
    for (const dsinfer::TensorInfo& t : file->tensors()) {
      if (t.num_bytes > 0) sink += t.data[0] + t.data[t.num_bytes - 1];
      if (t.data < data || t.data + t.num_bytes > data + size) std::abort();
    }
    for (const auto& [key, value] : file->metadata()) sink += static_cast<unsigned>(key.size() + value.size());
    volatile unsigned keep = sink;
    (void)keep;
  } catch (const dsinfer::Error&) {
    // Rejected input: the expected outcome for most mutations.
  }
  return 0;
}
