// The initiation steps every operation shares (import_initiation.hpp's
// launch): an operation is made holding nothing of the handler, can be
// cancelled before it starts, and its completion then runs exactly once,
// with Cancelled, every consumed source released once.
#include <future>
#include <memory>
#include <vector>

#include "catch2/catch.hpp"
#include "dlasync/detail/import_initiation.hpp"
#include "dlasync/import.hpp"
#include "support/copy_budget.hpp"
#include "support/runtime_fixture.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using testing::deleter_count;
using testing::require_status;
using testing::second_cpu;

// Above runtime_options::inline_copy_bytes (4 MiB): a copy on the workers,
// not one made on the calling thread.
constexpr std::size_t floats = (8 << 20) / sizeof(float);
constexpr std::uint64_t budget = 64 << 20;

// `floats` host floats as a 1-d tensor spec.
struct floats_source {
  std::vector<float> data = std::vector<float>(floats, 1.0F);
  testing::tensor_spec spec;
  floats_source() {
    spec.shape = {static_cast<std::int64_t>(floats)};
    spec.data = data.data();
  }
};

import_options onto_second_cpu() {
  import_options o;
  o.target = second_cpu;
  return o;
}

}  // namespace

TEST_CASE("an import cancelled before it starts completes once with Cancelled",
          "[transfer][import][cancel]") {
  std::unique_ptr<runtime> rt = testing::make_runtime(2, budget);
  floats_source data;
  deleter_count count;
  managed_tensor source = testing::make_tensor(data.spec, count);
  detail::import_begun begun = detail::begin_import(*rt, source, onto_second_cpu());
  REQUIRE_FALSE(begun.ready);  // a copy onto another device: an operation
  REQUIRE(begun.op);
  CHECK(source.empty());  // consumed by begin_import

  detail::cancel(*begun.op);
  detail::cancel(*begun.op);  // any number of times
  int calls = 0;
  std::promise<absl::StatusOr<tensor>> got;
  detail::start(begun.op, [&](absl::StatusOr<tensor> r) {
    ++calls;
    got.set_value(std::move(r));
  });
  absl::StatusOr<tensor> result = got.get_future().get();
  require_status(result.status(), absl::StatusCode::kCancelled, {"before its copy started"});
  CHECK(testing::eventually([&] { return count.calls.load() == 1; }));
  CHECK(testing::eventually([&] { return rt->in_flight() == 0; }));
  CHECK(testing::copy_budget(*rt).in_use() == 0);
  CHECK(calls == 1);
}

TEST_CASE("a batch cancelled before it starts completes once, its copies Cancelled",
          "[transfer][import][batch][cancel]") {
  std::unique_ptr<runtime> rt = testing::make_runtime(2, budget);
  floats_source data;
  std::vector<deleter_count> counts(3);
  std::vector<managed_tensor> sources;
  for (deleter_count& c : counts) sources.push_back(testing::make_tensor(data.spec, c));

  std::shared_ptr<detail::batch_operation> op = detail::make_batch(*rt);
  detail::cancel(*op);
  int calls = 0;
  std::promise<detail::batch_result> got;
  detail::start(
      op,
      [&](detail::batch_result r) {
        ++calls;
        got.set_value(std::move(r));
      },
      sources, onto_second_cpu());
  detail::batch_result results = got.get_future().get();
  REQUIRE(results.size() == 3);
  for (const absl::StatusOr<tensor>& r : results) {
    require_status(r.status(), absl::StatusCode::kCancelled, {"cancelled before its copies"});
  }
  for (deleter_count& c : counts) CHECK(testing::eventually([&] { return c.calls.load() == 1; }));
  CHECK(testing::eventually([&] { return rt->in_flight() == 0; }));
  CHECK(testing::copy_budget(*rt).in_use() == 0);
  CHECK(calls == 1);
}

}  // namespace dlasync
