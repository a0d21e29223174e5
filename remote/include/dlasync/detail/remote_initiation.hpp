// dlasync/detail/remote_initiation.hpp
//
// Plumbing for async_import_remote (node.hpp): the operation lives in the
// library (remote/src/); its result reaches an Asio completion handler on
// the handler's executor. Not for direct use.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "dlasync/detail/import_initiation.hpp"
#include "dlasync/import_options.hpp"
#include "dlasync/runtime.hpp"
#include "dlasync/tensor.hpp"

namespace dlasync {
struct remote_descriptor;
struct remote_bundle;
class remote_node;
}  // namespace dlasync

namespace dlasync::detail {

class remote_import;

// One remote import: made, then started (dlasync/detail/import_initiation.hpp's
// launch). `done` runs exactly once, on a thread of the runtime or of the
// node, or on the starting thread when validation refuses (deliver_to posts
// the handler onwards in every case).
std::shared_ptr<remote_import> make_remote_import(remote_node& node);
// Validates `descriptor` against `options`, then asks for the hold and
// fetches.
void start(const std::shared_ptr<remote_import>& op,
           absl::AnyInvocable<void(absl::StatusOr<tensor>) &&> done,
           const remote_descriptor& descriptor, const import_options& options);
// The same for the members of `bundle`, with one result for all.
void start(const std::shared_ptr<remote_import>& op,
           absl::AnyInvocable<void(absl::StatusOr<std::vector<tensor>>) &&> done,
           const remote_bundle& bundle, const import_options& options);
// Stops the import if it has not finished; any thread, any number of times,
// also before it starts.
void cancel(remote_import& op);

struct initiate_remote_import {
  remote_node* node;
  runtime* rt;

  template <typename Handler>
  void operator()(Handler&& handler, const remote_descriptor& descriptor,
                  const import_options& options) const {
    launch<absl::StatusOr<tensor>>(std::forward<Handler>(handler), *rt, make_remote_import(*node),
                                   descriptor, options);
  }

  template <typename Handler>
  void operator()(Handler&& handler, const remote_bundle& bundle,
                  const import_options& options) const {
    launch<absl::StatusOr<std::vector<tensor>>>(std::forward<Handler>(handler), *rt,
                                                make_remote_import(*node), bundle, options);
  }
};

}  // namespace dlasync::detail
