// A user's newer dlpack.h included before dlasync's headers wins, and
// dlasync works with its declarations.
#include <dlpack/dlpack.h>

#include "dlasync/dlasync.hpp"

#include "catch2/catch.hpp"
#include "runtime/src/device_registry_factory.hpp"

#ifndef DLASYNC_TEST_NEWER_DLPACK
#error "the stand-in newer dlpack.h was not the one included"
#endif
#ifdef DLASYNC_DECLARES_DLPACK_V1
#error "dlasync declared the 1.x types although a 1.x header was included first"
#endif

namespace {

int deleted = 0;

void count_delete(DLManagedTensorVersioned*) {
  ++deleted;
}

}  // namespace

TEST_CASE("a newer dlpack.h included first is used", "[transfer][dlpack]") {
  bool data[6] = {};
  std::int64_t shape[2] = {2, 3};
  DLManagedTensorVersioned m{};
  m.version = {1, 1};
  m.deleter = &count_delete;
  m.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  m.dl_tensor.data = data;
  m.dl_tensor.device = {kDLCPU, 0};
  m.dl_tensor.ndim = 2;
  m.dl_tensor.dtype = {kDLBool, 8, 1};
  m.dl_tensor.shape = shape;
  {
    dlasync::managed_tensor source(&m);
    const dlasync::device_registry registry = *dlasync::detail::device_registry_factory::host_only(
        dlasync::process_topology::single_process());
    absl::StatusOr<dlasync::tensor> t = dlasync::import_view(source, {}, registry);
    REQUIRE(t.ok());
    CHECK(t->dtype() == dlasync::dtypes::bool8);
    CHECK(t->read_only());
  }
  CHECK(deleted == 1);
  DLDevice maia{kDLMAIA, 2};
  CHECK(dlasync::device_from_dl(maia) == dlasync::device{dlasync::device_kind::maia, 2});
}
