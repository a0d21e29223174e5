// Example support: command-line parsing with abseil's flags, where --help
// lists the example's own flags (abseil's default lists only flags defined in
// a file named like the program).
#pragma once

namespace dlasync::examples {

// Sets `usage` as the program's usage message, then parses the command line;
// exits on --help or a bad flag, as abseil does.
void parse_flags(int argc, char** argv, const char* usage);

}  // namespace dlasync::examples
