// Counter-based standard normal values: value i of stream `seed` depends on (seed, i) alone, so a
// tensor of random weights fills in parallel in any split, on the host or on the device, and the
// two agree up to the last bits of their logarithm, sine and cosine.
#pragma once

#include <math.h>

#include <cstdint>

#include "core/host_device.h"

namespace dsinfer {

// Word `index` of stream `seed`: splitmix64 (a Weyl sequence through its finaliser), which can
// start at any index.
DS_HOST_DEVICE inline uint64_t random_word(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct NormalPair {
  float first, second;
};

// Two independent standard normal values from one 64-bit word: Box-Muller on two 24-bit
// uniforms, the first in (0, 1] so that its logarithm is finite.
DS_HOST_DEVICE inline NormalPair normal_pair(uint64_t bits) {
  constexpr float kTwoPi = 6.28318530717958647692f;
  const float u1 = static_cast<float>((bits >> 40) + 1) * 0x1p-24f;
  const float u2 = static_cast<float>((bits >> 16) & 0xFFFFFFu) * 0x1p-24f;
  const float radius = sqrtf(-2.0f * logf(u1));
  return {radius * cosf(kTwoPi * u2), radius * sinf(kTwoPi * u2)};
}

// Value i of stream `seed`: the first or second value of word i / 2's pair.
DS_HOST_DEVICE inline float normal_value(uint64_t seed, int64_t i) {
  const NormalPair pair = normal_pair(random_word(seed, static_cast<uint64_t>(i / 2)));
  return i % 2 == 0 ? pair.first : pair.second;
}

}  // namespace dsinfer
