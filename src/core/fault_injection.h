// Failures on purpose, for tests of the code that handles them. DSINFER_INJECT_FAULTS holds
// "site:N[,site:N…]": the Nth pass through `site` (counted per process from when the variable
// took its current value; a site may be named more than once) throws Error(kResourceExhausted),
// as a failed device allocation there would. Unset, a pass costs one getenv.
//
// Sites: "forward" (a model step, after its first layer was launched), "engine_step" (the
// engine's step outside a model step: an unexpected failure).
#pragma once

namespace dsinfer {

void maybe_inject_fault(const char* site);

}  // namespace dsinfer
