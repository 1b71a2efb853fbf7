// DSINFER_INJECT_FAULTS: the Nth pass through a site fails; "site:slow=MS" makes every pass
// through a site wait first; items of other forms change nothing.
#include "core/fault_injection.h"

#include <gtest/gtest.h>

#include <chrono>

#include "core/status.h"
#include "scoped_faults.h"

namespace dsinfer {
namespace {

using testing::ScopedFaults;

// Milliseconds one pass through `site` took, or -1 where it threw.
double pass_ms(const char* site) {
  const auto start = std::chrono::steady_clock::now();
  try {
    maybe_inject_fault(site);
  } catch (const Error&) {
    return -1;
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

TEST(FaultInjection, TheNamedPassOfASiteFailsAndNoOther) {
  ScopedFaults faults("forward:2");
  EXPECT_NO_THROW(maybe_inject_fault("forward"));
  EXPECT_NO_THROW(maybe_inject_fault("engine_step"));
  try {
    maybe_inject_fault("forward");
    FAIL() << "the second pass through forward should fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kResourceExhausted);
  }
  EXPECT_NO_THROW(maybe_inject_fault("forward"));
}

TEST(FaultInjection, ASlowSiteWaitsAtEveryPassAndStillFailsWhereNamed) {
  ScopedFaults faults("engine_step:slow=30,engine_step:2");
  EXPECT_GE(pass_ms("engine_step"), 30.0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(pass_ms("engine_step"), -1.0) << "the second pass fails, after its wait";
  const std::chrono::duration<double, std::milli> failed_after = std::chrono::steady_clock::now() - start;
  EXPECT_GE(failed_after.count(), 30.0);
  EXPECT_GE(pass_ms("engine_step"), 30.0);
}

TEST(FaultInjection, MalformedItemsAreIgnored) {
  ScopedFaults faults("forward:slow=x,forward:slow=-5,forward:0,forward:,forward:2x,forward:3");
  EXPECT_GE(pass_ms("forward"), 0.0);
  EXPECT_GE(pass_ms("forward"), 0.0);
  EXPECT_EQ(pass_ms("forward"), -1.0) << "the well-formed item still counts";
}

TEST(FaultInjection, UnsetNoPassFails) {
  set_injected_faults("");
  for (int i = 0; i < 3; ++i) EXPECT_GE(pass_ms("forward"), 0.0);
}

}  // namespace
}  // namespace dsinfer
