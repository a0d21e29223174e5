#include "common/flags.hpp"

#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace dlasync::examples {

void parse_flags(int argc, char** argv, const char* usage) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view path) {
    return absl::StrContains(path, "examples/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  // Source paths as they are in the repository, not where it was built.
  config.normalize_filename = [](absl::string_view path) {
    const std::size_t at = path.rfind("examples/");
    return std::string(at == absl::string_view::npos ? path : path.substr(at));
  };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
}

}  // namespace dlasync::examples
