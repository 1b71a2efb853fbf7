#include "bench_report.h"

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace dsinfer::cli {

std::string machine_description() {
  std::ifstream cpu("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(cpu, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  std::ostringstream os;
  os << model << ", " << std::thread::hardware_concurrency() << " threads";
  return os.str();
}

std::string utc_timestamp() {
  char text[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  return text;
}

std::string command_line(int argc, char** argv) {
  std::string out = "dsinfer";
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                         "0123456789-_=./,:+@%") == std::string::npos;
    out += " ";
    if (plain) {
      out += a;
    } else {
      out += "'";
      for (char ch : a) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
      out += "'";
    }
  }
  return out;
}

bool append_results(const std::string& path, const std::string& text) {
  const bool exists = std::filesystem::exists(path);
  std::ofstream f(path, std::ios::app);
  if (!f) return false;
  if (!exists) f << "# dsinfer benchmark results\n";
  f << "\n" << text;
  return static_cast<bool>(f);
}

}  // namespace dsinfer::cli
