#include "core/fault_injection.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>

#include "core/status.h"

namespace dsinfer {
namespace {

struct Faults {
  std::mutex mu;
  std::string spec;                               // the value the counts below belong to
  std::map<std::string, std::set<long>> at_pass;  // site → the passes that fail
  std::map<std::string, long> passes;             // site → passes so far
};

Faults& faults() {
  static Faults f;
  return f;
}

void parse(const std::string& spec, std::map<std::string, std::set<long>>& at_pass) {
  at_pass.clear();
  std::istringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos) continue;
    char* end = nullptr;
    const long n = std::strtol(item.c_str() + colon + 1, &end, 10);
    if (n > 0 && end != nullptr && *end == '\0') at_pass[item.substr(0, colon)].insert(n);
  }
}

}  // namespace

void maybe_inject_fault(const char* site) {
  const char* env = std::getenv("DSINFER_INJECT_FAULTS");
  if (env == nullptr || *env == '\0') return;
  Faults& f = faults();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.spec != env) {
    f.spec = env;
    parse(f.spec, f.at_pass);
    f.passes.clear();
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
