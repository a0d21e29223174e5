// Imports a tensor through the installed package and prints what it saw.
#include <cstdio>

#include "dlasync/dlasync.hpp"

int main() {
  float data[6] = {0, 1, 2, 3, 4, 5};
  std::int64_t shape[2] = {2, 3};
  DLManagedTensor m{};
  m.dl_tensor.data = data;
  m.dl_tensor.device = dlasync::to_dl_device(dlasync::host_device);
  m.dl_tensor.ndim = 2;
  m.dl_tensor.dtype = dlasync::dtypes::float32.to_dl();
  m.dl_tensor.shape = shape;
  dlasync::managed_tensor source(&m);
  absl::StatusOr<dlasync::device_registry> registry =
      dlasync::device_registry::host_only(dlasync::process_topology::single_process());
  if (!registry.ok()) return 1;
  absl::StatusOr<dlasync::tensor> t = dlasync::import_view(source, {}, *registry);
  if (!t.ok() || t->element_count() != 6 || t->data() != data) {
    std::fprintf(stderr, "import failed\n");
    return 1;
  }
  std::printf("consumer imported %s %s tensor of %lld elements\n", t->device().name().c_str(),
              t->dtype().name().c_str(), static_cast<long long>(t->element_count()));
  return 0;
}
