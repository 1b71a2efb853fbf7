// What every `dsinfer bench` section written to a results file carries: the date, the machine
// and the exact command, so a figure can be reproduced and compared.
#pragma once

#include <string>

namespace dsinfer::cli {

// "<CPU model>, <N> threads" from /proc/cpuinfo.
std::string machine_description();
// Today's UTC date and time, "YYYY-MM-DD HH:MM UTC".
std::string utc_timestamp();
// "dsinfer <argv[0]> <argv[1]> ...", arguments with spaces or shell characters single-quoted.
std::string command_line(int argc, char** argv);
// Appends `text` to the file at `path` after a blank line (creating it with a title line when it
// does not exist yet); false when the file cannot be written.
bool append_results(const std::string& path, const std::string& text);

}  // namespace dsinfer::cli
