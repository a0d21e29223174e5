#include "dlasync/validate.hpp"

#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dlasync {

// The payload is text, "consumed=1;rule=shape;copy=cross_device,alignment":
// readable in a log, and parsed back here.
absl::Status with_import_error(absl::Status status, const import_error& error) {
  if (status.ok()) return status;
  status.SetPayload(import_error_url,
                    absl::Cord(absl::StrCat("consumed=", error.consumed ? 1 : 0,
                                            ";rule=", error.rule, ";copy=", error.copy_reasons)));
  return status;
}

std::optional<import_error> import_error_of(const absl::Status& status) {
  const absl::optional<absl::Cord> payload = status.GetPayload(import_error_url);
  if (!payload) return std::nullopt;
  import_error e;
  const std::string text(*payload);
  for (absl::string_view field : absl::StrSplit(text, ';')) {
    const std::size_t eq = field.find('=');
    if (eq == absl::string_view::npos) continue;
    const absl::string_view key = field.substr(0, eq);
    const absl::string_view value = field.substr(eq + 1);
    if (key == "consumed") e.consumed = value == "1";
    if (key == "rule") e.rule = std::string(value);
    if (key == "copy") e.copy_reasons = std::string(value);
  }
  return e;
}

}  // namespace dlasync
