// A remote import cancelled before it starts (import_initiation.hpp's
// launch assigns the cancellation slot before the start): its completion
// runs once, with Cancelled, and the exporter is asked for nothing.
#include <future>
#include <memory>

#include "catch2/catch.hpp"
#include "dlasync/detail/remote_initiation.hpp"
#include "dlasync/remote.hpp"
#include "remote/remote_fixture.hpp"
#include "support/copy_budget.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {

TEST_CASE("a remote import cancelled before it starts completes once, and holds nothing",
          "[remote][ucx][cancel]") {
  node_pair nodes;
  // One importer: a hold asked for by the cancelled import would use up
  // the publication, and the import after it would be refused.
  auto p = publish_here(nodes.out(), "contiguous", {16, 16});

  std::shared_ptr<detail::remote_import> op = detail::make_remote_import(nodes.in());
  detail::cancel(*op);
  detail::cancel(*op);  // any number of times
  int calls = 0;
  std::promise<absl::StatusOr<tensor>> got;
  detail::start(op,
                [&](absl::StatusOr<tensor> r) {
                  ++calls;
                  got.set_value(std::move(r));
                },
                p->descriptor, {});
  absl::StatusOr<tensor> cancelled = got.get_future().get();
  testing::require_status(cancelled.status(), absl::StatusCode::kCancelled, {"cancelled"});
  CHECK(calls == 1);
  CHECK(nodes.in().imports_in_flight() == 0);
  CHECK(testing::copy_budget(*nodes.importer_->rt).in_use() == 0);

  // The publication still serves its one importer.
  absl::StatusOr<tensor> t = import_now(nodes.in(), p->descriptor);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  check_bytes(*t, "contiguous", {16, 16}, dtypes::float32, 1);
  CHECK(testing::eventually([&] { return p->count.calls.load() == 1; }));
}

}  // namespace dlasync
