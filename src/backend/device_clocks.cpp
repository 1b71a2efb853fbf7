#include "backend/device_clocks.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

namespace dsinfer {
namespace {

// The few NVML entry points used, with NVML's C signatures (nvml.h is not in the CUDA toolkit
// installed here; the ABI of these calls is stable across driver releases).
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;  // nvmlClockType_t NVML_CLOCK_SM
// nvmlClocksEventReasons bits.
constexpr unsigned long long kReasonSwPowerCap = 0x4, kReasonHwSlowdown = 0x8, kReasonSwThermal = 0x20,
                             kReasonHwThermal = 0x40, kReasonHwPowerBrake = 0x80;

struct Nvml {
  void* handle = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*device_by_index)(unsigned, NvmlDevice*) = nullptr;
  int (*clock_info)(NvmlDevice, int, unsigned*) = nullptr;
  int (*power_usage_mw)(NvmlDevice, unsigned*) = nullptr;
  int (*clock_reasons)(NvmlDevice, unsigned long long*) = nullptr;
};

struct Sample {
  unsigned sm_mhz = 0, power_mw = 0;
  unsigned long long reasons = 0;
};

}  // namespace

struct DeviceClockSampler::State {
  Nvml nvml;
  NvmlDevice device = nullptr;
  bool initialised = false;
  std::string unavailable_reason;
  std::chrono::microseconds period{2000};
  std::thread thread;
  std::atomic<bool> running{false};
  std::mutex mu;
  std::vector<Sample> samples;  // guarded by mu

  Sample read() const {
    Sample s;
    nvml.clock_info(device, kNvmlClockSm, &s.sm_mhz);
    if (nvml.power_usage_mw != nullptr) nvml.power_usage_mw(device, &s.power_mw);
    if (nvml.clock_reasons != nullptr) nvml.clock_reasons(device, &s.reasons);
    return s;
  }
};

DeviceClockSampler::DeviceClockSampler(unsigned nvml_index, std::chrono::microseconds period)
    : state_(std::make_unique<State>()) {
  State& st = *state_;
  st.period = period;
  Nvml& n = st.nvml;
  n.handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (n.handle == nullptr) {
    st.unavailable_reason = "libnvidia-ml.so.1 not found (no NVIDIA driver)";
    return;
  }
  auto symbol = [&](const char* name) { return dlsym(n.handle, name); };
  n.init = reinterpret_cast<int (*)()>(symbol("nvmlInit_v2"));
  n.shutdown = reinterpret_cast<int (*)()>(symbol("nvmlShutdown"));
  n.device_by_index = reinterpret_cast<int (*)(unsigned, NvmlDevice*)>(symbol("nvmlDeviceGetHandleByIndex_v2"));
  n.clock_info = reinterpret_cast<int (*)(NvmlDevice, int, unsigned*)>(symbol("nvmlDeviceGetClockInfo"));
  n.power_usage_mw = reinterpret_cast<int (*)(NvmlDevice, unsigned*)>(symbol("nvmlDeviceGetPowerUsage"));
  // Renamed in newer drivers; the old name stays as an alias.
  void* reasons = symbol("nvmlDeviceGetCurrentClocksEventReasons");
  if (reasons == nullptr) reasons = symbol("nvmlDeviceGetCurrentClocksThrottleReasons");
  n.clock_reasons = reinterpret_cast<int (*)(NvmlDevice, unsigned long long*)>(reasons);
  if (n.init == nullptr || n.shutdown == nullptr || n.device_by_index == nullptr || n.clock_info == nullptr) {
    st.unavailable_reason = "libnvidia-ml.so.1 lacks the clock queries";
    return;
  }
  if (n.init() != kNvmlSuccess) {
    st.unavailable_reason = "nvmlInit failed";
    return;
  }
  st.initialised = true;
  unsigned mhz = 0;
  if (n.device_by_index(nvml_index, &st.device) != kNvmlSuccess ||
      n.clock_info(st.device, kNvmlClockSm, &mhz) != kNvmlSuccess) {
    st.device = nullptr;
    st.unavailable_reason = "NVML has no device " + std::to_string(nvml_index) + " with an SM clock";
  }
}

DeviceClockSampler::~DeviceClockSampler() {
  stop();
  if (state_->initialised) state_->nvml.shutdown();
  if (state_->nvml.handle != nullptr) dlclose(state_->nvml.handle);
}

bool DeviceClockSampler::available() const { return state_->device != nullptr; }

const std::string& DeviceClockSampler::unavailable_reason() const { return state_->unavailable_reason; }

void DeviceClockSampler::start() {
  State& st = *state_;
  if (!available() || st.running.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.samples.clear();
  }
  st.thread = std::thread([&st] {
    auto next = std::chrono::steady_clock::now();
    while (st.running.load()) {
      const Sample s = st.read();
      {
        std::lock_guard<std::mutex> lock(st.mu);
        st.samples.push_back(s);
      }
      next += st.period;
      std::this_thread::sleep_until(next);
    }
  });
}

DeviceClockSummary DeviceClockSampler::stop() {
  State& st = *state_;
  if (!st.running.exchange(false)) return {};
  st.thread.join();
  std::lock_guard<std::mutex> lock(st.mu);
  DeviceClockSummary out;
  out.num_samples = static_cast<int>(st.samples.size());
  if (st.samples.empty()) return out;
  out.min_sm_mhz = st.samples[0].sm_mhz;
  double mhz_sum = 0, power_sum = 0;
  int capped = 0, thermal = 0;
  for (const Sample& s : st.samples) {
    mhz_sum += s.sm_mhz;
    power_sum += s.power_mw / 1000.0;
    out.min_sm_mhz = std::min(out.min_sm_mhz, s.sm_mhz);
    out.max_sm_mhz = std::max(out.max_sm_mhz, s.sm_mhz);
    if (s.reasons & (kReasonSwPowerCap | kReasonHwPowerBrake)) ++capped;
    if (s.reasons & (kReasonHwSlowdown | kReasonSwThermal | kReasonHwThermal)) ++thermal;
  }
  const double n = static_cast<double>(st.samples.size());
  out.mean_sm_mhz = mhz_sum / n;
  out.mean_power_w = power_sum / n;
  out.power_capped_share = capped / n;
  out.thermal_share = thermal / n;
  return out;
}

std::string DeviceClockSummary::describe() const {
  if (num_samples == 0) return "no samples";
  char text[200];
  std::snprintf(text, sizeof(text),
                "%.0f MHz mean (%u-%u), %.0f W, power-capped in %.0f%% and slowed for heat in %.0f%% of %d samples",
                mean_sm_mhz, min_sm_mhz, max_sm_mhz, mean_power_w, 100 * power_capped_share, 100 * thermal_share,
                num_samples);
  return text;
}

}  // namespace dsinfer
