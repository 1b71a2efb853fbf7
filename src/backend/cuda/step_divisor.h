// Division of a few-row block's step counter by a count fixed for the block (K's phases or
// chunks) as a multiply and a shift. The compiler's division by a value it cannot see is a dozen
// integer instructions, three of them a step, and at batch 1 each warp's steps are bound by the
// latency of their instructions.
//
// With magic = ceil(2^24 / divisor), s · magic >> 24 is s / divisor exactly while
// s · (divisor − 1) < 2^24, and s · magic fits in 32 bits while s < 2^7 · divisor. A block's
// steps stay below (units per block + depth) · divisor: 36 · divisor in the CUDA-core forms (32
// quads, four steps ahead), whose divisors are K / 1024 (bf16) or K / 2048 (e4m3); 8 · divisor
// in the tensor-core form (4 tiles, four steps ahead), whose divisor is K / 256. K below 2^18
// columns (with_block_form checks) keeps both: 36 · 256 · 255 and 8 · 1024 · 1023 are below 2^24.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace dsinfer::cuda {

// Below this many columns of K, StepDivisor's quotients are exact for every step of a block.
constexpr int64_t kStepDivisorMaxK = int64_t{1} << 18;

struct StepDivisor {
  uint32_t magic = 1u << 24;
  StepDivisor() = default;
  DS_HOST_DEVICE explicit StepDivisor(int divisor) {
    const uint32_t d = divisor > 1 ? static_cast<uint32_t>(divisor) : 1u;
    magic = ((1u << 24) + d - 1) / d;
  }
  DS_HOST_DEVICE int quotient(int s) const { return static_cast<int>(static_cast<uint32_t>(s) * magic >> 24); }
};

}  // namespace dsinfer::cuda
