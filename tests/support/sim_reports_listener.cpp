// Test support: the simulated CUDA runtime's reports (broken CUDA rules and
// stream-order races, runtime/sim/sim_checker.hpp) fail the test that
// caused them. Linked into every test program: when a test case ends, the
// reports no test claimed (sim_api::take_reports) become a failure of that
// test, each report printed in full.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "runtime/sim/sim_checker.hpp"

namespace dlasync::testing {
namespace {

class sim_reports_listener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(Catch::TestCaseInfo const& info) override { current_ = info.name; }

  // The test case's own section ends inside the test's run, so that a
  // failure here still counts for it.
  void sectionEnded(Catch::SectionStats const& stats) override {
    if (stats.sectionInfo.name != current_) return;
    const std::vector<std::string> reports = cuda::take_sim_reports();
    for (const std::string& r : reports) FAIL_CHECK("simulated CUDA report: " << r);
  }

 private:
  std::string current_;
};

CATCH_REGISTER_LISTENER(sim_reports_listener)

}  // namespace
}  // namespace dlasync::testing
