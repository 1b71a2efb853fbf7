// How a backend rounds the operands of its products.
#pragma once

#include <string>

namespace dsinfer {

// kDefault: as the backend chooses for speed (CUDA: bf16 activations, or DeepSeek's FP8
// activations for e4m3 weights in prefill-sized products). kFp32: nothing rounded below fp32
// (the CPU backend either way; the CUDA backend's fp32 precision mode, for checking a
// checkpoint or the engine at reference precision).
enum class Precision { kDefault, kFp32 };

// "default" or "fp32"; false for anything else (precision unchanged).
inline bool parse_precision(const std::string& name, Precision* precision) {
  if (name == "default") *precision = Precision::kDefault;
  else if (name == "fp32") *precision = Precision::kFp32;
  else return false;
  return true;
}

}  // namespace dsinfer
