// Run by the two-process locality test as the second process: builds a
// runtime from the launcher variables it was started with, tries to import a
// tensor on the GPU that belongs to the other rank, and checks the refusal.
// Exit status 0 when the refusal is as expected; the status is printed.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "asio/use_future.hpp"
#include "dlasync/dlasync.hpp"

namespace {

int deleted = 0;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const int foreign_ordinal = std::atoi(argv[1]);
  dlasync::runtime_options o;
  o.worker_threads = 1;
  absl::StatusOr<std::unique_ptr<dlasync::runtime>> rt = dlasync::runtime::create(o);
  if (!rt.ok()) {
    std::printf("runtime: %s\n", rt.status().ToString().c_str());
    return 3;
  }
  float data[4] = {};
  dlasync::managed_tensor source = dlasync::make_managed_tensor(
      {.data = data, .device = {dlasync::device_kind::cuda, foreign_ordinal}, .shape = {4}},
      [] { ++deleted; });
  absl::StatusOr<dlasync::tensor> t =
      dlasync::async_import_dlpack(**rt, source, {}, asio::use_future).get();
  std::printf("%s: %s\n", (*rt)->registry().topology().describe().c_str(),
              t.status().ToString().c_str());
  const bool refused = t.status().code() == absl::StatusCode::kFailedPrecondition;
  const bool kept = !source.empty() && deleted == 0;
  source.reset();
  return refused && kept && deleted == 1 ? 0 : 1;
}
