// Test support: a runtime's copy budget, which the public API does not
// hand out (a user could release bytes they never took); tests read and
// fill it to prove what imports reserve and return.
#pragma once

#include "dlasync/memory_budget.hpp"
#include "dlasync/runtime.hpp"
#include "runtime/src/runtime_core.hpp"

namespace dlasync::testing {

inline memory_budget& copy_budget(runtime& rt) {
  return *detail::core_of(rt).budget();
}

}  // namespace dlasync::testing
