#include "dlasync/producer.hpp"

#include <utility>

namespace dlasync {
namespace {

// A managed tensor and everything its DLTensor points to but the data.
template <typename Managed>
struct exported {
  Managed managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  absl::AnyInvocable<void() &&> release;

  static void destroy(Managed* self) {
    auto* e = static_cast<exported*>(self->manager_ctx);
    if (e->release) std::move(e->release)();
    delete e;
  }
};

template <typename Managed>
Managed* build(tensor_description& d, absl::AnyInvocable<void() &&> release) {
  auto* e = new exported<Managed>;
  e->shape = std::move(d.shape);
  e->release = std::move(release);
  DLTensor& dl = e->managed.dl_tensor;
  dl.data = d.data;
  dl.device = to_dl_device(d.device);
  dl.ndim = static_cast<std::int32_t>(e->shape.size());
  dl.dtype = d.dtype.to_dl();
  dl.shape = e->shape.data();
  if (d.strides) {
    e->strides = std::move(*d.strides);
    dl.strides = e->strides.data();
  }
  dl.byte_offset = d.byte_offset;
  e->managed.manager_ctx = e;
  e->managed.deleter = &exported<Managed>::destroy;
  return &e->managed;
}

}  // namespace

managed_tensor make_managed_tensor(tensor_description d, absl::AnyInvocable<void() &&> release,
                                   dlpack_abi abi) {
  if (abi == dlpack_abi::legacy) {
    return managed_tensor(build<DLManagedTensor>(d, std::move(release)));
  }
  DLManagedTensorVersioned* t = build<DLManagedTensorVersioned>(d, std::move(release));
  t->version = DLPackVersion{dlpack_major_version, dlpack_minor_version};
  t->flags = d.flags;
  return managed_tensor(t);
}

}  // namespace dlasync
