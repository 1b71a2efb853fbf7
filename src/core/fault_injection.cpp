#include "core/fault_injection.h"

#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>

#include "core/status.h"

namespace dsinfer {
namespace {

struct Faults {
  std::mutex mu;
  std::string spec;                               // the value the counts below belong to
  std::map<std::string, std::set<long>> at_pass;  // site → the passes that fail
  std::map<std::string, long> slow_ms;            // site → the wait of every pass
  std::map<std::string, long> passes;             // site → passes so far
};

Faults& faults() {
  static Faults f;
  return f;
}

// A positive whole number spelled exactly, else 0.
long positive_number(const char* text) {
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  return n > 0 && end != text && *end == '\0' ? n : 0;
}

// Items of other forms are ignored.
void parse(const std::string& spec, Faults& f) {
  f.at_pass.clear();
  f.slow_ms.clear();
  std::istringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos) continue;
    const std::string site = item.substr(0, colon), value = item.substr(colon + 1);
    constexpr std::string_view kSlow = "slow=";
    if (value.starts_with(kSlow)) {
      if (const long ms = positive_number(value.c_str() + kSlow.size())) f.slow_ms[site] = ms;
    } else if (const long n = positive_number(value.c_str())) {
      f.at_pass[site].insert(n);
    }
  }
}

}  // namespace

void maybe_inject_fault(const char* site) {
  const char* env = std::getenv("DSINFER_INJECT_FAULTS");
  if (env == nullptr || *env == '\0') return;
  Faults& f = faults();
  std::unique_lock<std::mutex> lock(f.mu);
  if (f.spec != env) {
    f.spec = env;
    parse(f.spec, f);
    f.passes.clear();
  }
  if (auto slow = f.slow_ms.find(site); slow != f.slow_ms.end()) {
    const long ms = slow->second;
    lock.unlock();  // other sites pass meanwhile
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    lock.lock();
  }
  auto it = f.at_pass.find(site);
  if (it == f.at_pass.end()) return;
  const long pass = ++f.passes[site];
  if (it->second.count(pass))
    throw Error(StatusCode::kResourceExhausted,
                std::string("injected fault at ") + site + " (pass " + std::to_string(pass) + ")");
}

void set_injected_faults(const std::string& spec) {
  Faults& f = faults();
  std::lock_guard<std::mutex> lock(f.mu);
  if (spec.empty()) unsetenv("DSINFER_INJECT_FAULTS");
  else setenv("DSINFER_INJECT_FAULTS", spec.c_str(), 1);
  f.spec.clear();  // the next pass parses the value afresh, with counts from zero
}

}  // namespace dsinfer
