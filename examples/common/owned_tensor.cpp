#include "owned_tensor.hpp"

namespace dlasync::examples {
namespace {

struct owned_box {
  DLManagedTensorVersioned managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::shared_ptr<void> keep;

  static void destroy(DLManagedTensorVersioned* self) {
    delete static_cast<owned_box*>(self->manager_ctx);
  }
};

}  // namespace

managed_tensor make_managed(std::shared_ptr<void> keep, void* data, dtype type,
                            std::span<const std::int64_t> shape,
                            std::span<const std::int64_t> strides, device where,
                            std::uint64_t flags) {
  auto box = std::make_unique<owned_box>();
  box->shape.assign(shape.begin(), shape.end());
  box->strides.assign(strides.begin(), strides.end());
  box->keep = std::move(keep);
  DLTensor& dl = box->managed.dl_tensor;
  dl.data = data;
  dl.device = to_dl_device(where);
  dl.ndim = static_cast<std::int32_t>(box->shape.size());
  dl.dtype = type.to_dl();
  dl.shape = box->shape.data();
  dl.strides = strides.empty() ? nullptr : box->strides.data();
  dl.byte_offset = 0;
  box->managed.version = {dlpack_major_version, dlpack_minor_version};
  box->managed.flags = flags;
  box->managed.manager_ctx = box.get();
  box->managed.deleter = &owned_box::destroy;
  return managed_tensor(&box.release()->managed);
}

}  // namespace dlasync::examples
