// Test support: claiming the simulated CUDA runtime's reports in tests that
// break a rule on purpose (others fail through sim_reports_listener.cpp).
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/sim/sim_api.hpp"

namespace dlasync::testing {

// Takes `sim`'s reports and requires exactly `count` of them, each holding
// every one of `words`.
inline std::vector<std::string> require_reports(cuda::sim_api& sim, std::size_t count,
                                                std::initializer_list<const char*> words) {
  std::vector<std::string> reports = sim.take_reports();
  INFO("reports: " << reports.size());
  for (const std::string& r : reports) UNSCOPED_INFO(r);
  REQUIRE(reports.size() == count);
  for (const std::string& r : reports) {
    for (const char* w : words) CHECK_THAT(r, Catch::Matchers::Contains(w));
  }
  return reports;
}

}  // namespace dlasync::testing
