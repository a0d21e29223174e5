// The example server's models on the host, with a runtime of their own,
// for tests that drive the server's handlers directly.
#pragma once

#include <memory>
#include <optional>

#include "asio/awaitable.hpp"
#include "asio/co_spawn.hpp"
#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "common/device_sum.hpp"
#include "dlasync/dlasync.hpp"
#include "kserve_models.hpp"

namespace dlasync::examples::kserve {

// A host runtime and the models, as the server makes them; shut down at the
// end of the test.
struct host_models {
  host_models() {
    runtime_options o;
    o.cuda = "off";
    o.worker_threads = 1;
    absl::StatusOr<std::unique_ptr<runtime>> created = runtime::create(o);
    REQUIRE(created.ok());
    rt = *std::move(created);
    absl::StatusOr<std::unique_ptr<device_sum>> made = device_sum::create(*rt);
    REQUIRE(made.ok());
    compute = *std::move(made);
    models.emplace(*rt, *compute, host_device);
  }
  ~host_models() { rt->shutdown(); }
  host_models(const host_models&) = delete;
  host_models& operator=(const host_models&) = delete;

  // `a`'s result, run on the runtime's executor.
  template <typename T>
  T run(asio::awaitable<T> a) {
    return asio::co_spawn(rt->get_executor(), std::move(a), asio::use_future).get();
  }

  std::unique_ptr<runtime> rt;
  std::unique_ptr<device_sum> compute;
  std::optional<model_handler> models;
};

}  // namespace dlasync::examples::kserve
