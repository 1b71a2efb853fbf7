// Failures on purpose, for tests of the code that handles them. DSINFER_INJECT_FAULTS holds
// "site:N[,site:N…]": the Nth pass through `site` (counted from when the process first saw the
// value, or from set_injected_faults; a site may be named more than once) throws
// Error(kResourceExhausted), as a failed device allocation there would. "site:slow=MS" makes
// every pass through `site` wait MS milliseconds first, as a slow device would, so that a test
// can act while a request is surely still running. Unset, a pass costs one getenv.
//
// Sites: "forward" (a model step, after its first layer was launched), "engine_step" (the
// engine's step outside a model step: an unexpected failure).
#pragma once

#include <string>

namespace dsinfer {

void maybe_inject_fault(const char* site);

// Sets DSINFER_INJECT_FAULTS to `spec` (empty: unsets it) and starts the counts anew, for code
// that sets it in-process (tests), where the same value set twice must count from zero again.
void set_injected_faults(const std::string& spec);

}  // namespace dsinfer
