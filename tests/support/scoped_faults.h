// DSINFER_INJECT_FAULTS (core/fault_injection.h) set for a scope, unset at its end, so that a
// failed assertion leaves no faults to the tests after it.
#pragma once

#include "core/fault_injection.h"

namespace dsinfer::testing {

class ScopedFaults {
 public:
  explicit ScopedFaults(const char* spec) { set_injected_faults(spec); }
  ~ScopedFaults() { set_injected_faults(""); }
  ScopedFaults(const ScopedFaults&) = delete;
  ScopedFaults& operator=(const ScopedFaults&) = delete;
};

}  // namespace dsinfer::testing
