// Imports a tensor through the installed package and prints what it saw.
#include <cstdio>

#include "dlasync/dlasync.hpp"

int main() {
  float data[6] = {0, 1, 2, 3, 4, 5};
  int released = 0;
  dlasync::managed_tensor source =
      dlasync::make_managed_tensor({.data = data, .shape = {2, 3}}, [&released] { ++released; });
  absl::StatusOr<std::unique_ptr<dlasync::runtime>> rt =
      dlasync::runtime::create({.worker_threads = 1, .cuda = "off"});
  if (!rt.ok()) return 1;
  absl::StatusOr<dlasync::tensor> t = dlasync::import_view(source, {}, (*rt)->registry());
  if (!t.ok() || t->element_count() != 6 || t->data() != data || released != 0) {
    std::fprintf(stderr, "import failed\n");
    return 1;
  }
  std::printf("consumer imported %s %s tensor of %lld elements\n", t->device().name().c_str(),
              t->dtype().name().c_str(), static_cast<long long>(t->element_count()));
  *t = dlasync::tensor();
  if (released != 1) {
    std::fprintf(stderr, "the producer's tensor was not released once\n");
    return 1;
  }
  return 0;
}
