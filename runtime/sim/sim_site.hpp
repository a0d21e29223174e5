// How the simulation's reports name a call site (internal to runtime/sim/):
// the file from the repository's top folder on, and the line.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "runtime/src/cuda/cuda_api.hpp"

namespace dlasync::cuda {

inline std::string site_name(const call_site& where) {
  std::string_view file = where.file;
  std::size_t first = std::string_view::npos;
  for (std::string_view top : {"/runtime/", "/transfer/", "/tests/", "/examples/", "/bench/"}) {
    first = std::min(first, file.find(top));
  }
  if (first != std::string_view::npos) file.remove_prefix(first + 1);
  return absl::StrCat(std::string(file), ":", where.line);
}

}  // namespace dlasync::cuda
