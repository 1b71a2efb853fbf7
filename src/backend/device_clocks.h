// What a GPU's clocks did while a benchmark ran: its SM clock, power draw and the reasons the
// driver gave for holding the clock down, sampled from a thread through NVML. The library is
// loaded at run time (libnvidia-ml ships with the driver, not the toolkit), so the binary runs
// where there is none; the sampler then says it is unavailable and measures nothing.
//
// A run's rate against a ceiling measured in the same run compares like with like only if both
// ran at similar clocks; the summary says whether they did.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace dsinfer {

struct DeviceClockSummary {
  int num_samples = 0;
  double mean_sm_mhz = 0;
  unsigned min_sm_mhz = 0, max_sm_mhz = 0;
  double mean_power_w = 0;
  // Share of the samples in which the driver held the clock below what was asked for to stay
  // within the power limit (software power cap) or for heat (software or hardware slowdown).
  double power_capped_share = 0, thermal_share = 0;

  // "1952 MHz mean (1770-1980), 612 W, power-capped in 40% and slowed for heat in 0% of 61
  // samples"; "no samples".
  std::string describe() const;
};

class DeviceClockSampler {
 public:
  // NVML's device `nvml_index` (the order nvidia-smi lists; CUDA's device 0 where one GPU is
  // visible), sampled every `period` between start() and stop().
  explicit DeviceClockSampler(unsigned nvml_index = 0,
                              std::chrono::microseconds period = std::chrono::microseconds(2000));
  ~DeviceClockSampler();
  DeviceClockSampler(const DeviceClockSampler&) = delete;
  DeviceClockSampler& operator=(const DeviceClockSampler&) = delete;

  // Whether NVML loaded and knows the device; when false start() and stop() do nothing.
  bool available() const;
  // Why not, when not available ("libnvidia-ml.so.1 not found", ...).
  const std::string& unavailable_reason() const;

  void start();
  // The samples since start(); an empty summary when none was taken or it was not started.
  DeviceClockSummary stop();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace dsinfer
